"""Message ids that are one int64 serialized as 8 bytes little-endian (Kafka offsets, RocksMQ/embedded ids)."""

from __future__ import annotations

import struct

from msgstream_spark.errors import DecodeError
from msgstream_spark.mq.base import MessageID


class Int64MessageID(MessageID):
    """Shared by the backends whose Milvus encoding is an 8-byte little-endian int64."""

    __slots__ = ("value",)
    kind = "int64"

    def __init__(self, value: int) -> None:
        self.value = int(value)

    def serialize(self) -> bytes:
        return struct.pack("<q", self.value)

    def at_earliest_position(self) -> bool:
        return self.value <= 0

    def sort_key(self) -> tuple:
        return (self.value,)

    @property
    def offset(self) -> int:
        return self.value

    @classmethod
    def deserialize(cls, data: bytes) -> Int64MessageID:
        if len(data) != 8:
            raise DecodeError(f"a {cls.kind} message id is 8 bytes (little-endian int64), got {len(data)}",
                              msg_id=bytes(data))
        return cls(struct.unpack("<q", data)[0])

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.value})"
