"""Kafka message ids: the partition-0 offset, serialized as 8-byte little-endian int64."""

from __future__ import annotations

from msgstream_spark.mq.int_id import Int64MessageID

OFFSET_BEGINNING = -2  # librdkafka's OffsetBeginning: Milvus's EarliestMessageID


class KafkaMessageID(Int64MessageID):
    __slots__ = ()
    kind = "Kafka"
