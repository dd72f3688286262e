"""Pulsar message ids: ``MessageIdData`` bytes exactly as Milvus 2.5 writes them (wire doc §3.3).

Milvus's Go client always writes ledger, entry, partition, batch_index and batch_size, so a
message of a non-partitioned, non-batched topic (ledger 12, entry 3) is
``08 0c 10 03 18 00 20 00 30 01``. The Python client's own serialization omits fields at their
defaults and carries partition/batch_index -1; we encode by hand and read all three forms
(2.5, 2.4 without batch_size, and the client's).
"""

from __future__ import annotations

from typing import Any

from msgstream_spark.errors import DecodeError
from msgstream_spark.mq.base import MessageID
from msgstream_spark.msg.wire import encode_varint as _varint
from msgstream_spark.msg.wire import iter_fields

_U64 = 1 << 64


def _signed(value: int, bits: int = 64) -> int:
    value &= _U64 - 1
    if bits == 32:
        value &= 0xFFFFFFFF
        return value - (1 << 32) if value >= 1 << 31 else value
    return value - _U64 if value >= 1 << 63 else value


class PulsarMessageID(MessageID):
    """(ledger, entry, batch index) of one message; ``batch_size`` > 1 only for batched entries."""

    __slots__ = ("ledger", "entry", "batch_index", "batch_size", "_cid")
    kind = "Pulsar"

    def __init__(self, ledger: int, entry: int, batch_index: int = -1, batch_size: int = 0,
                 client_id: Any = None) -> None:
        self.ledger = int(ledger)
        self.entry = int(entry)
        self.batch_index = int(batch_index)
        self.batch_size = int(batch_size)
        self._cid = client_id  # the client's own id object when received (acks use it as is)

    def __reduce__(self):  # the client's id object stays behind: it is rebuilt from the numbers
        return (type(self), (self.ledger, self.entry, self.batch_index, self.batch_size))

    # -- constructors --------------------------------------------------------------------------------
    @classmethod
    def earliest(cls) -> PulsarMessageID:
        return cls(-1, -1, -1, 0)

    @classmethod
    def deserialize(cls, data: bytes) -> PulsarMessageID:
        """Parse any ``MessageIdData`` encoding (Milvus 2.5, 2.4, or the Python client's)."""
        try:  # ack_set / first_chunk_message_id (length-delimited) are not part of the position
            fields = {num: value for num, wire, value, _ in iter_fields(data) if wire == 0}
        except (IndexError, ValueError) as exc:
            raise DecodeError(f"malformed Pulsar MessageIdData ({exc}): {data.hex(' ')}", msg_id=bytes(data)) \
                from None
        if 1 not in fields or 2 not in fields:
            raise DecodeError(f"Pulsar MessageIdData without ledgerId/entryId: {data.hex(' ')}", msg_id=bytes(data))
        return cls(_signed(fields[1]), _signed(fields[2]), _signed(fields.get(4, _U64 - 1), 32),
                   _signed(fields.get(6, 0), 32))

    # -- MessageID -----------------------------------------------------------------------------------
    def at_earliest_position(self) -> bool:
        return self.ledger <= 0 and self.entry <= 0 and self.batch_index <= 0

    def sort_key(self) -> tuple:
        if self.ledger < 0:
            return (-1, -1, -1)
        # a non-batched message is batch index -1 in the client's ids and 0 in Milvus's: the same message
        return (self.ledger, self.entry, max(self.batch_index, 0))

    def serialize(self) -> bytes:
        if self.ledger < 0 and self.entry < 0:  # EarliestMessageID as the Go client writes it
            return b"\x08" + _varint(-1) + b"\x10" + _varint(-1) + b"\x18" + _varint(-1) + b"\x20" + _varint(-1) \
                + b"\x30\x00"
        return (b"\x08" + _varint(self.ledger) + b"\x10" + _varint(self.entry) + b"\x18\x00"
                + b"\x20" + _varint(max(self.batch_index, 0)) + b"\x30" + _varint(max(self.batch_size, 1)))

    def to_client(self) -> Any:
        """The client's ``_pulsar.MessageId`` to seek or acknowledge with."""
        import pulsar

        if self._cid is not None:
            return self._cid
        if self.ledger < 0:
            return pulsar.MessageId.earliest
        batch = self.batch_index if self.batch_size > 1 else -1
        return pulsar.MessageId(-1, self.ledger, self.entry, batch)._msg_id

    def __repr__(self) -> str:
        batch = f", batch {self.batch_index}/{self.batch_size}" if self.batch_size > 1 else ""
        return f"PulsarMessageID({self.ledger}:{self.entry}{batch})"
