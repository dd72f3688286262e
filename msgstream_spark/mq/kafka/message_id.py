"""Kafka message ids: the partition-0 offset, serialized as 8-byte little-endian int64."""

from __future__ import annotations

import struct

from msgstream_spark.errors import DecodeError
from msgstream_spark.mq.base import MessageID

OFFSET_BEGINNING = -2  # librdkafka's OffsetBeginning: Milvus's EarliestMessageID


class KafkaMessageID(MessageID):
    __slots__ = ("value",)

    def __init__(self, offset: int) -> None:
        self.value = int(offset)

    def serialize(self) -> bytes:
        return struct.pack("<q", self.value)

    def at_earliest_position(self) -> bool:
        return self.value <= 0

    def sort_key(self) -> tuple:
        return (self.value,)

    @classmethod
    def deserialize(cls, data: bytes) -> KafkaMessageID:
        if len(data) != 8:
            raise DecodeError(f"a Kafka message id is 8 bytes (little-endian offset), got {len(data)}",
                              msg_id=bytes(data))
        return cls(struct.unpack("<q", data)[0])

    def __repr__(self) -> str:
        return f"KafkaMessageID({self.value})"
