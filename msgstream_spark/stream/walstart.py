"""Starting a read from Milvus 2.6 resume points: a WAL checkpoint or a WAL message id (wal doc §4).

Milvus 2.6 keeps a pchannel's progress as a ``streaming.WALCheckpoint`` (etcd
``streamingnode-meta/wal/<pchannel>/consume-checkpoint``) and names messages by a
``common.MessageID`` (WAL id string + WAL name). Resuming from either follows Milvus: start AT the
id and skip what has a time tick <= the checkpoint's (a bare message id skips nothing). Both become
a ``MsgPosition`` with the legacy id bytes and ``wal_name`` set, which every reader here seeks to
(``MsgStream.seek``, ``msgstream tail --from``, the Spark source's start). A 2.6 row position
(``_position`` of a row: the ``_lc`` of its message) is already such a ``MsgPosition``.

Starting at a last-confirmed id is what keeps transactions whole: Milvus never lets a message's
``_lc`` move past the Begin of a transaction that is still open, so a read from it sees the Begin.
"""

from __future__ import annotations

from msgstream_spark.errors import ConfigError, DecodeError
from msgstream_spark.msg.position import MsgPosition, parse_positions
from msgstream_spark.msg.wal26 import WalCheckpoint, WalMessageId, WALName
from msgstream_spark.stream.decode import wal_name

Start = MsgPosition | WalCheckpoint | WalMessageId


def check_wal(channel: str, wal: WALName, backend: str | None) -> None:
    """A resume point written by one WAL cannot be used on another backend's ids."""
    if backend is None or wal == WALName.Unknown:
        return
    try:
        mine = wal_name(backend)
    except ConfigError:
        return  # a user-registered backend: its ids are checked when seeking
    if mine != wal:
        raise ConfigError(f"channel {channel}: the start position is a {wal.name} WAL id, but the backend is "
                          f"{backend} ({mine.name} ids); was it taken from another cluster's WAL?")


def resume_position(channel: str, start: Start, *, backend: str | None = None) -> MsgPosition:
    """The ``MsgPosition`` a reader of ``channel`` seeks to for a WAL checkpoint, WAL message id or position.

    ``backend`` (``local``/``kafka``/``pulsar``) checks that the id belongs to this backend's WAL.
    """
    if isinstance(start, MsgPosition):
        return start
    if isinstance(start, WalCheckpoint):
        if start.message_id is None:
            raise ConfigError(f"channel {channel}: the WAL checkpoint has no message id")
        mid, ts = start.message_id, int(start.time_tick)
    elif isinstance(start, WalMessageId):
        mid, ts = start, 0
    else:
        raise ConfigError(f"channel {channel}: cannot start from a {type(start).__name__}")
    check_wal(channel, mid.wal, backend)
    try:
        data = mid.to_legacy_bytes()
    except DecodeError as exc:
        raise ConfigError(f"channel {channel}: start position {mid}: {exc.reason}") from None
    return MsgPosition(channel, data, "", ts, int(mid.wal))


def parse_start(channel: str, text: str, kind: str, *, backend: str | None = None) -> MsgPosition:
    """Parse a start given as text: ``kind`` = ``checkpoint`` (base64 ``streaming.WALCheckpoint``),
    ``message_id`` (JSON ``{"id", "wal_name"}`` or base64 ``common.MessageID``) or ``position``
    (JSON or base64 ``msgpb.MsgPosition``)."""
    try:
        if kind == "checkpoint":
            value: Start = WalCheckpoint.parse(text)
        elif kind == "message_id":
            value = WalMessageId.parse(text)
        elif kind == "position":
            found = parse_positions(text)
            if len(found) != 1:
                raise ValueError(f"expected one position, got {len(found)}")
            value = found[0]
        else:
            raise ConfigError(f"unknown start kind {kind!r}; expected checkpoint, message_id or position")
    except (ValueError, DecodeError) as exc:
        raise ConfigError(f"channel {channel}: not a {kind.replace('_', ' ')}: {exc}") from None
    return resume_position(channel, value, backend=backend)


__all__ = ["Start", "check_wal", "parse_start", "resume_position"]
