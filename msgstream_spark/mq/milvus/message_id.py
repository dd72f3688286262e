"""Milvus WAL message ids as the proxy's ``DumpMessages`` hands them out (``common.MessageID``).

An id is the WAL's id string plus the WAL's name (:class:`~msgstream_spark.msg.wal26.WalMessageId`).
``serialize()`` gives the ``common.MessageID`` protobuf, so a Spark offset names its WAL. When the
id came from a delivered message, two extra fields (numbers unknown to Milvus, skipped by every
protobuf reader) carry that message's ``_tt`` and ``_lc``: resuming from them is exact even across
a transaction that was still open at the id (wal doc, "Resuming exactly once").
"""

from __future__ import annotations

import base64
import binascii

from msgstream_spark.errors import DecodeError
from msgstream_spark.mq.base import MessageID
from msgstream_spark.msg.wal26 import WalMessageId, WALName
from msgstream_spark.msg.wal26.types import b36decode
from msgstream_spark.msg.wire import encode_varint, iter_fields

_TT_FIELD = 14  # our resume hints; not in common.MessageID
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

    __slots__ = ("wal_id", "time_tick", "last_confirmed")

    def __init__(self, wal_id: WalMessageId, time_tick: int | None = None,
                 last_confirmed: str | None = None) -> None:
        self.wal_id = wal_id
        self.time_tick = time_tick
        self.last_confirmed = last_confirmed

    @property
    def wal(self) -> WALName:
        return self.wal_id.wal

    @property
    def id(self) -> str:
        return self.wal_id.id

    def serialize(self) -> bytes:
        out = self.wal_id.to_proto_bytes()
        if self.time_tick:
            out += encode_varint(_TT_FIELD << 3) + encode_varint(self.time_tick)
        if self.last_confirmed:
            raw = self.last_confirmed.encode()
            out += encode_varint(_LC_FIELD << 3 | 2) + encode_varint(len(raw)) + raw
        return out

    @classmethod
    def deserialize(cls, data: bytes) -> MilvusMessageID:
        data = bytes(data)
        wid, wal, tt, lc = "", 0, None, None
        try:
            for num, wire, val, start in iter_fields(data):
                if num == 1 and wire == 2:
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
        return cls(WalMessageId(wal_name, wid), tt, lc)

    def at_earliest_position(self) -> bool:
        return self.sort_key() <= earliest_for(self.wal).sort_key()

    def sort_key(self) -> tuple:
        text = self.wal_id.id
        if self.wal == WALName.Pulsar:
            return _pulsar_key(text)
        try:
            return (1, b36decode(text, signed=True))
        except ValueError:
            return _pulsar_key(text) if self.wal == WALName.Unknown else (2, text)

    @property
    def offset(self) -> int | None:
        key = self.sort_key()
        return key[1] if len(key) == 2 and isinstance(key[1], int) else None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MilvusMessageID):
            return NotImplemented
        return self.sort_key() == other.sort_key()

    def __hash__(self) -> int:
        return hash(("milvus", self.sort_key()))

    def __repr__(self) -> str:
        return f"MilvusMessageID({self.wal.name}:{self.wal_id.id})"

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
