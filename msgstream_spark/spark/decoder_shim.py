"""The per-channel decoder the Spark source reads through (one reader for 2.5 and 2.6 messages).

LEAD: SWAP ME. The stream layer's ``msgstream_spark.stream.decode.ChannelDecoder`` (branch
``core26``) is the one decoder of the project; when it is importable it is used and the
stand-in below is not. The stand-in has the same shape (``feed`` -> ``Decoded``, ``has_open``,
``oldest_open``) and is built from the same parts (``wal26.decode_message``, ``wal_position``,
``stream.txn.TxnAssembler``, ``stream.seek.SeekFilter``), so the source behaves the same with
either; delete this module's stand-in once the stream layer's decoder is merged.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from msgstream_spark.errors import DecodeError
from msgstream_spark.msg.types import DeleteMsg, InsertMsg, MsgType, TsMsg
from msgstream_spark.msg.wal26 import (
    WalMessageId,
    WalMessageType,
    WALName,
    decode_message,
    time_tick_of,
    vchannel_of,
    wal_position,
)
from msgstream_spark.stream.seek import SeekFilter
from msgstream_spark.stream.txn import TxnAssembler

WAL_OF_BACKEND = {"kafka": WALName.Kafka, "pulsar": WALName.Pulsar}  # the embedded log: RocksMQ-form ids


def wal_name(backend: str) -> WALName:
    """The ``WALName`` whose id forms a backend's message ids take."""
    return WAL_OF_BACKEND.get(backend, WALName.RocksMQ)


def own_wal_id(backend: str, msg_id: bytes) -> WalMessageId | None:
    """A broker id as a WAL id (for ``_lcs``), None when the bytes are not a legacy id of that WAL."""
    try:
        return WalMessageId.from_legacy_bytes(wal_name(backend), msg_id)
    except DecodeError:
        return None


@dataclass
class _Decoded:
    """One released message: what a Milvus consumer applies, with where it came from."""

    msg: TsMsg
    raw: Any
    time_tick: int
    vchannel: str | None
    position: Any
    version: int
    txn_id: int | None
    broadcast_id: int | None
    row_bearing: bool


class _ShimDecoder:
    """Stand-in for ``stream.decode.ChannelDecoder`` (see the module docstring)."""

    def __init__(self, channel: str, wal: str, *, start_ts: int | None = None) -> None:
        self.channel = channel
        self.wal = wal
        self._txn = TxnAssembler()
        self._seek = SeekFilter(start_ts)
        self._raw: dict[int, Any] = {}  # id(msg) -> broker message, for bodies held until their commit

    @property
    def has_open(self) -> bool:
        return self._txn.has_open

    @property
    def oldest_open(self) -> Any:
        return self._txn.oldest_open()

    def feed(self, m: Any) -> list[_Decoded]:
        mid = m.id.serialize()
        msg = decode_message(m.payload, m.properties, channel=self.channel, msg_id=mid)
        if msg.wal is not None:
            msg.position = wal_position(msg.wal, wal_name(self.wal), own_wal_id(self.wal, mid))
        self._raw[id(msg)] = m
        out = []
        for r in self._txn.feed(msg):
            raw = self._raw.pop(id(r), m)
            d = _decoded(r, raw)
            if self._seek.active and not self._seek.keep(_is_tick(r), d.time_tick):
                continue
            out.append(d)
        if not self._txn.has_open:
            self._raw.clear()  # dropped (rolled back / expired) bodies
        return out


def _is_tick(msg: TsMsg) -> bool:
    if msg.wal is not None:
        return msg.wal.msg_type == WalMessageType.TimeTick
    return msg.msg_type == MsgType.TimeTick


def _decoded(msg: TsMsg, raw: Any) -> _Decoded:
    env = msg.wal
    rows = isinstance(msg, (InsertMsg, DeleteMsg)) and not (env is not None and env.is_control_vchannel)
    return _Decoded(msg, raw, time_tick_of(msg), vchannel_of(msg), msg.position, 0 if env is None else env.version,
                    None if env is None else env.txn_id, None if env is None else env.broadcast_id, rows)


try:  # the stream layer's decoder, once merged (branch core26)
    from msgstream_spark.stream.decode import ChannelDecoder, Decoded  # type: ignore[import-not-found]
except ImportError:  # pragma: no cover - until the merge
    ChannelDecoder = _ShimDecoder  # type: ignore[misc,assignment]
    Decoded = _Decoded  # type: ignore[misc,assignment]

__all__ = ["ChannelDecoder", "Decoded", "own_wal_id", "wal_name"]
