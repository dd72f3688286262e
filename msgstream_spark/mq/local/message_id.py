"""Embedded-log message ids: int64, serialized as 8-byte little-endian like RocksMQ/Kafka."""

from __future__ import annotations

import struct

from msgstream_spark.errors import DecodeError
from msgstream_spark.mq.base import MessageID

EARLIEST = -1


class LocalMessageID(MessageID):
    __slots__ = ("value",)

    def __init__(self, value: int) -> None:
        self.value = int(value)

    def serialize(self) -> bytes:
        return struct.pack("<q", self.value)

    def at_earliest_position(self) -> bool:
        return self.value <= 0

    def sort_key(self) -> tuple:
        return (self.value,)

    @classmethod
    def deserialize(cls, data: bytes) -> LocalMessageID:
        if len(data) != 8:
            raise DecodeError(f"an embedded-log message id is 8 bytes, got {len(data)}", msg_id=bytes(data))
        return cls(struct.unpack("<q", data)[0])

    def __repr__(self) -> str:
        return f"LocalMessageID({self.value})"
