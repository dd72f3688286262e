"""Milvus WAL message ids as the proxy's ``DumpMessages`` hands them out (``common.MessageID``).

An id is the WAL's id string plus the WAL's name (:class:`~msgstream_spark.msg.wal26.WalMessageId`).
``serialize()`` gives the ``common.MessageID`` protobuf, so a Spark offset names its WAL. When the
id came from a delivered message, extra fields (numbers unknown to Milvus, skipped by every
protobuf reader) carry that message's ``_tt`` and ``_lc``: resuming from them is exact even across
a transaction that was still open at the id (wal doc, "Resuming exactly once").

Order: the proxy sends entries sorted by ``_tt`` (a transaction at its commit's), so ids that know
their ``_tt`` order by ``(_tt, WAL position)``: the order they were delivered in, which is what
readers compare ("the batch ends at id X"). Bare ids (no ``_tt``: a position's legacy bytes, a
``MessageID`` given by a user) are positions, where a read starts, and order by WAL position.
Compared with a bare id, a delivered id stands for its own position, its ``_lc`` (Milvus's
``MsgPosition`` of the message): a start position at or after the first message's ``_lc`` is
no loss (it is often a TimeTick before that message, which the proxy never sends). Ids are not
increasing in delivery order: an insert written while a transaction was open comes after that
transaction's Commit, with a smaller id.
Equality is the entry's: the same WAL id (and the same synthetic-tick flag) whatever the hints.
A *synthetic tick* id (``tick``) is a time tick the consumer adds (consumer.py). :data:`TICK_AFTER`: after a
delivered message, it orders right after it and a resume from it continues after that message.
:data:`TICK_BEFORE`: before version-0 entries that share the ``_tt`` right above the tick's (the rest of
them may still come): it orders before them and a resume from it starts at their ``_lc`` with
``start_timetick`` = that ``_tt``, so all of them come again.
"""

from __future__ import annotations

import base64
import binascii

from msgstream_spark.errors import DecodeError
from msgstream_spark.mq.base import MessageID
from msgstream_spark.msg.wal26 import WalMessageId, WALName
from msgstream_spark.msg.wal26.types import b36decode
from msgstream_spark.msg.wire import encode_varint, iter_fields

_TICK_FIELD = 13  # our resume hints; not in common.MessageID
TICK_AFTER, TICK_BEFORE = 1, 2  # the kinds of synthetic ticks (``tick``; 0: a message)
_TT_FIELD = 14
_LC_FIELD = 15


def _pulsar_key(text: str) -> tuple:
    try:
        data = base64.b64decode(text, validate=True)
        found = {num: val for num, wire, val, _ in iter_fields(data) if wire == 0}
    except (binascii.Error, ValueError):
        return (2, text)
    ledger, entry = found.get(1, 0), found.get(2, 0)
    # Pulsar's earliest id is ledger = entry = -1 (uint64 max): order it first
    ledger = -1 if ledger >= 1 << 63 else ledger
    entry = -1 if entry >= 1 << 63 else entry
    return (1, ledger, entry, found.get(4, -1))


class MilvusMessageID(MessageID):
    """A ``common.MessageID`` with optional resume hints (the message's ``_tt`` and ``_lc``)."""

    __slots__ = ("wal_id", "time_tick", "last_confirmed", "tick")

    def __init__(self, wal_id: WalMessageId, time_tick: int | None = None,
                 last_confirmed: str | None = None, tick: int = 0) -> None:
        self.wal_id = wal_id
        self.time_tick = time_tick
        self.last_confirmed = last_confirmed
        self.tick = int(tick)

    @property
    def wal(self) -> WALName:
        return self.wal_id.wal

    @property
    def id(self) -> str:
        return self.wal_id.id

    def serialize(self) -> bytes:
        out = self.wal_id.to_proto_bytes()
        if self.tick:
            out += encode_varint(_TICK_FIELD << 3) + encode_varint(self.tick)
        if self.time_tick:
            out += encode_varint(_TT_FIELD << 3) + encode_varint(self.time_tick)
        if self.last_confirmed:
            raw = self.last_confirmed.encode()
            out += encode_varint(_LC_FIELD << 3 | 2) + encode_varint(len(raw)) + raw
        return out

    @classmethod
    def deserialize(cls, data: bytes) -> MilvusMessageID:
        data = bytes(data)
        wid, wal, tt, lc, tick = "", 0, None, None, 0
        try:
            for num, wire, val, start in iter_fields(data):
                if num == _TICK_FIELD and wire == 0:
                    tick = val if val in (TICK_AFTER, TICK_BEFORE) else 0
                elif num == 1 and wire == 2:
                    wid = data[start:start + val].decode("utf-8")
                elif num == 2 and wire == 0:
                    wal = val
                elif num == _TT_FIELD and wire == 0:
                    tt = val
                elif num == _LC_FIELD and wire == 2:
                    lc = data[start:start + val].decode("utf-8")
            wal_name = WALName(wal)
        except (ValueError, UnicodeDecodeError) as exc:
            raise DecodeError(f"not a Milvus WAL message id (common.MessageID protobuf): {exc}",
                              msg_id=data) from None
        if not wid:
            raise DecodeError("a Milvus WAL message id has an empty id string", msg_id=data)
        if not (wid.isascii() and wid.isprintable()):  # WAL id strings are base 36 or base 64 text
            raise DecodeError(f"a Milvus WAL message id string is not text: {wid!r}", msg_id=data)
        return cls(WalMessageId(wal_name, wid), tt, lc, tick)

    def at_earliest_position(self) -> bool:
        return not self.time_tick and self.wal_key() <= earliest_for(self.wal).wal_key()

    def sort_key(self) -> tuple:
        """``(_tt, WAL position, tick)``: delivery order; ``_tt`` 0 for a bare id."""
        return (self.time_tick or 0, self.wal_key(), self.tick)

    def _keys(self, other: MessageID) -> tuple[tuple, tuple]:
        """The keys ``self`` and ``other`` compare by: delivery order when both know their ``_tt`` (or neither
        does), else positions: a bare id is one, a delivered id stands for its own (its ``_lc``)."""
        if not isinstance(other, MilvusMessageID) or bool(self.time_tick) == bool(other.time_tick):
            return self.sort_key(), other.sort_key()
        if self.same_entry(other):
            return (), ()
        return self._position_key(), other._position_key()

    def _position_key(self) -> tuple:
        """Where a read that must see this message starts, as a WAL key: its ``_lc``, else itself."""
        if self.time_tick and self.last_confirmed:
            return MilvusMessageID(WalMessageId(self.wal, self.last_confirmed)).wal_key()
        return self.wal_key()

    def __lt__(self, other: MessageID) -> bool:
        a, b = self._keys(other)
        return a < b

    def __le__(self, other: MessageID) -> bool:
        a, b = self._keys(other)
        return a <= b

    def __gt__(self, other: MessageID) -> bool:
        a, b = self._keys(other)
        return a > b

    def __ge__(self, other: MessageID) -> bool:
        a, b = self._keys(other)
        return a >= b

    def wal_key(self) -> tuple:
        """The entry's position in the WAL (base-36 offsets and ids, Pulsar ledger/entry)."""
        text = self.wal_id.id
        if self.wal == WALName.Pulsar:
            return _pulsar_key(text)
        try:
            return (1, b36decode(text, signed=True))
        except ValueError:
            return _pulsar_key(text) if self.wal == WALName.Unknown else (2, text)

    @property
    def offset(self) -> int | None:
        key = self.wal_key()
        return key[1] if len(key) == 2 and isinstance(key[1], int) else None

    def same_entry(self, other: MilvusMessageID) -> bool:
        return self.wal_key() == other.wal_key()

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MilvusMessageID):
            return NotImplemented
        return self.wal_key() == other.wal_key() and self.tick == other.tick

    def __hash__(self) -> int:
        return hash(("milvus", self.wal_key(), self.tick))

    def __repr__(self) -> str:
        return f"MilvusMessageID({self.wal.name}:{self.wal_id.id}{' tick' if self.tick else ''})"

    __str__ = __repr__


# Pulsar's MessageIdData{ledgerId = entryId = -1}: its "earliest".
_PULSAR_EARLIEST = base64.b64encode(b"\x08" + encode_varint((1 << 64) - 1) + b"\x10"
                                    + encode_varint((1 << 64) - 1)).decode()


def earliest_for(wal: WALName) -> MilvusMessageID:
    """The id that starts a read at the oldest retained entry, for ``include_start_message=true``.

    Kafka: offset 0 (a truncated offset restarts at the earliest retained one); RocksMQ and the
    cluster's own WAL (Unknown): id 0; Pulsar: ledger = entry = -1.
    """
    if wal == WALName.Pulsar:
        return MilvusMessageID(WalMessageId(wal, _PULSAR_EARLIEST))
    if wal == WALName.WoodPecker:
        raise DecodeError("Woodpecker WAL ids are not supported (Go-only format); name a start id the proxy "
                          "handed out instead")
    return MilvusMessageID(WalMessageId(wal, "0"))


def from_legacy(wal: WALName, data: bytes) -> MilvusMessageID | None:
    """An id from ``MsgPosition.msgID`` bytes (a position's), when the WAL's legacy form is known.

    8 bytes are a Kafka offset or a RocksMQ id (an Unknown WAL: the cluster's own, sent as base 36);
    a Pulsar cluster's are ``MessageIdData`` bytes. ``None`` when the bytes fit no form.
    """
    try:
        if wal == WALName.Pulsar:
            return MilvusMessageID(WalMessageId.from_legacy_bytes(wal, data))
        if len(data) == 8:
            value = int.from_bytes(data, "little", signed=True)
            return MilvusMessageID(WalMessageId(wal, WalMessageId.kafka(value).id))
    except DecodeError:
        return None
    return None
