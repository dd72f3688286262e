"""Embedded-log message ids: int64, serialized as 8-byte little-endian like RocksMQ/Kafka."""

from __future__ import annotations

from msgstream_spark.mq.int_id import Int64MessageID

EARLIEST = -1


class LocalMessageID(Int64MessageID):
    __slots__ = ()
    kind = "embedded-log"
