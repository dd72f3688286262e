"""WAL message ids, their legacy byte form, ``common.MessageID`` and ``streaming.WALCheckpoint`` (wal doc §4).

A WAL id is a string whose form depends on the WAL: Kafka and RocksMQ write the int64 offset /
id in base 36 (offset 1000 -> ``rs``), Pulsar writes standard base64 of the ``MessageIdData``
bytes. The *legacy* bytes are what 2.5 (and Milvus's 2.6 adaptor) put in ``msgpb.MsgPosition.msgID``:
8-byte little-endian int64 for Kafka/RocksMQ, the ``MessageIdData`` bytes for Pulsar.
"""

from __future__ import annotations

import base64
import binascii
import json
import struct
from dataclasses import dataclass

from msgstream_spark.errors import DecodeError
from msgstream_spark.msg.codec import encode_varint, iter_fields
from msgstream_spark.msg.position import MsgPosition
from msgstream_spark.msg.wal26 import fields
from msgstream_spark.msg.wal26.headers import MESSAGE_ID, WAL_CHECKPOINT
from msgstream_spark.msg.wal26.types import WALName, b36decode, b36encode

_INT_WALS = (WALName.Kafka, WALName.RocksMQ)


def _check_pulsar(data: bytes, text: str) -> None:
    try:
        found = {num for num, wire, _, _ in iter_fields(data) if wire == 0}
    except ValueError as exc:
        raise DecodeError(f"Pulsar WAL id {text!r} is not a MessageIdData protobuf: {exc}") from None
    if not {1, 2} <= found:
        raise DecodeError(f"Pulsar WAL id {text!r} has no ledgerId/entryId")


@dataclass(frozen=True)
class WalMessageId:
    """A 2.6 WAL message id: the WAL's id string plus which WAL wrote it (``common.MessageID``)."""

    wal: WALName
    id: str

    # -- the legacy bytes of msgpb.MsgPosition.msgID --------------------------------------------
    def to_legacy_bytes(self) -> bytes:
        """The bytes Milvus's adaptor writes into ``MsgPosition.msgID`` for this id."""
        if self.wal in _INT_WALS:
            return struct.pack("<q", self.int_value)
        if self.wal == WALName.Pulsar:
            try:
                data = base64.b64decode(self.id, validate=True)
            except (binascii.Error, ValueError):
                raise DecodeError(f"Pulsar WAL id {self.id!r} is not standard base64") from None
            _check_pulsar(data, self.id)
            return data
        raise DecodeError(f"{self.wal.name} WAL ids have no legacy byte form this library knows "
                          "(Kafka, Pulsar and RocksMQ do)")

    @classmethod
    def from_legacy_bytes(cls, wal: WALName | str | int, data: bytes) -> WalMessageId:
        wal = WALName.parse(wal) if not isinstance(wal, WALName) else wal
        if wal in _INT_WALS:
            if len(data) != 8:
                raise DecodeError(f"a {wal.name} message id is 8 bytes (little-endian int64), got {len(data)}",
                                  msg_id=bytes(data))
            return cls(wal, b36encode(struct.unpack("<q", data)[0]))
        if wal == WALName.Pulsar:
            text = base64.b64encode(bytes(data)).decode("ascii")
            _check_pulsar(bytes(data), text)
            return cls(wal, text)
        raise DecodeError(f"{wal.name} WAL ids have no legacy byte form this library knows")

    @property
    def int_value(self) -> int:
        """The offset (Kafka) or id (RocksMQ) of an integer id."""
        if self.wal not in _INT_WALS:
            raise DecodeError(f"a {self.wal.name} WAL id is not an integer")
        try:
            return b36decode(self.id, signed=True)
        except ValueError:
            raise DecodeError(f"{self.wal.name} WAL id {self.id!r} is not a base-36 int64") from None

    @classmethod
    def kafka(cls, offset: int) -> WalMessageId:
        return cls(WALName.Kafka, b36encode(offset))

    @classmethod
    def pulsar(cls, message_id_data: bytes) -> WalMessageId:
        return cls.from_legacy_bytes(WALName.Pulsar, message_id_data)

    # -- common.MessageID -----------------------------------------------------------------------
    def to_proto_bytes(self) -> bytes:
        """``common.MessageID{id = 1; WAL_name = 2}`` (proto3: defaults omitted)."""
        raw = self.id.encode("utf-8")
        out = (b"\x0a" + encode_varint(len(raw)) + raw) if raw else b""
        return out + (b"\x10" + encode_varint(int(self.wal)) if self.wal else b"")

    @classmethod
    def from_proto_bytes(cls, data: bytes) -> WalMessageId:
        try:
            d = fields.decode(MESSAGE_ID, data)
        except ValueError as exc:
            raise DecodeError(f"not a common.MessageID protobuf: {exc}", msg_id=bytes(data)) from None
        return cls.from_dict(d)

    @classmethod
    def from_dict(cls, d: dict) -> WalMessageId:
        """From ``{"id": ..., "wal_name": ...}`` (pymilvus's ``start_message_id`` shape)."""
        if not isinstance(d, dict) or "id" not in d:
            raise ValueError(f"a WAL message id needs the keys id and wal_name, got {d!r}")
        wal = d.get("wal_name", d.get("WAL_name", d.get("wal", 0)))
        return cls(WALName.parse(wal), str(d["id"]))

    def to_dict(self) -> dict:
        return {"id": self.id, "wal_name": self.wal.name}

    @classmethod
    def parse(cls, text: str) -> WalMessageId:
        """A JSON ``{"id", "wal_name"}`` object or base64 of a ``common.MessageID`` protobuf."""
        t = text.strip()
        if t.startswith("{"):
            try:
                return cls.from_dict(json.loads(t))
            except json.JSONDecodeError as exc:
                raise ValueError(f"WAL message id is not valid JSON: {exc}") from None
        try:
            return cls.from_proto_bytes(base64.b64decode(t, validate=True))
        except (binascii.Error, ValueError):
            raise ValueError(f"WAL message id is neither JSON nor base64 of common.MessageID: {t[:40]!r}") from None

    def __str__(self) -> str:
        return f"{self.wal.name}:{self.id}"


@dataclass(frozen=True)
class WalCheckpoint:
    """``streaming.WALCheckpoint`` as kept at ``streamingnode-meta/wal/<pchannel>/consume-checkpoint``."""

    message_id: WalMessageId | None
    time_tick: int = 0
    recovery_magic: int = 0

    @classmethod
    def from_proto_bytes(cls, data: bytes) -> WalCheckpoint:
        try:
            d = fields.decode(WAL_CHECKPOINT, data)
        except ValueError as exc:
            raise ValueError(f"not a streaming.WALCheckpoint protobuf ({len(data)} bytes): {exc}") from None
        mid = WalMessageId.from_dict(d["message_id"]) if d["message_id"] else None
        return cls(mid, d["time_tick"], d["recovery_magic"])

    @classmethod
    def parse(cls, text: str | bytes) -> WalCheckpoint:
        """Base64 text (or the raw bytes etcd holds) of a ``streaming.WALCheckpoint``."""
        if isinstance(text, bytes):
            return cls.from_proto_bytes(text)
        try:
            raw = base64.b64decode(text.strip(), validate=True)
        except (binascii.Error, ValueError):
            raise ValueError(f"WAL checkpoint is not valid base64: {text[:40]!r}") from None
        return cls.from_proto_bytes(raw)

    def to_position(self, channel: str) -> MsgPosition:
        """The equivalent legacy position: start AT the id, skip what has a time tick <= ``time_tick``."""
        if self.message_id is None:
            raise ValueError(f"WAL checkpoint of {channel} has no message id")
        return MsgPosition(channel, self.message_id.to_legacy_bytes(), "", self.time_tick, int(self.message_id.wal))


def position_of(*, vchannel: str, time_tick: int, last_confirmed: WalMessageId) -> MsgPosition:
    """The ``msgpb.MsgPosition`` Milvus's adaptor builds for a WAL message (wal doc §4)."""
    return MsgPosition(vchannel, last_confirmed.to_legacy_bytes(), "", int(time_tick), int(last_confirmed.wal))
