"""What travels through the backend SPI: message ids, messages read, messages to send.

Its own module, below :mod:`msgstream_spark.mq.base` and :mod:`msgstream_spark.mq.batch`, so
both import it and neither imports the other's (``base`` re-exports these names).
"""

from __future__ import annotations

import abc
from collections.abc import Mapping
from dataclasses import dataclass, field


class MessageID(abc.ABC):
    """A backend message id. Ordered within one channel."""

    @abc.abstractmethod
    def serialize(self) -> bytes:
        """The Milvus byte encoding (what goes into ``MsgPosition.msgID``)."""

    @abc.abstractmethod
    def at_earliest_position(self) -> bool:
        """True when this id denotes the start of the channel."""

    @abc.abstractmethod
    def sort_key(self) -> tuple:
        """A tuple that orders ids of one channel (used by comparisons)."""

    @property
    def offset(self) -> int | None:
        """The integer offset this id denotes where the backend has them (Kafka, the embedded log)."""
        return None

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, MessageID):
            return NotImplemented
        return type(self) is type(other) and self.sort_key() == other.sort_key()

    def __lt__(self, other: MessageID) -> bool:
        return self.sort_key() < other.sort_key()

    def __le__(self, other: MessageID) -> bool:
        return self.sort_key() <= other.sort_key()

    def __gt__(self, other: MessageID) -> bool:
        return self.sort_key() > other.sort_key()

    def __ge__(self, other: MessageID) -> bool:
        return self.sort_key() >= other.sort_key()

    def __hash__(self) -> int:
        return hash((type(self).__name__, self.sort_key()))


@dataclass(frozen=True)
class ProducerMessage:
    """A payload and its properties (Kafka headers / Pulsar properties)."""

    payload: bytes
    properties: Mapping[str, str] = field(default_factory=dict)
    # Hybrid timestamp of the message, when known: backends that index by time
    # (Kafka record timestamps, the embedded log) use it for timestamp lookups.
    timestamp: int | None = None


@dataclass(slots=True)
class Message:
    """A message as read from a channel (treat as read-only).

    Not a frozen dataclass on purpose: consumers build one per message on their hot path, and
    a frozen dataclass's ``__init__`` costs about three times as much.
    """

    channel: str
    payload: bytes
    properties: Mapping[str, str]
    id: MessageID
    # Hybrid timestamp recorded by the producer, if the backend keeps one.
    timestamp: int | None = None
