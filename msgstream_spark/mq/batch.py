"""A fetched group of one channel's messages as parallel lists: the bulk read path of the SPI.

``Consumer.receive_batch`` builds one :class:`~msgstream_spark.mq.message.Message` (plus a
message id and a properties dict) per record. A reader that only needs each payload, its
position and its type (the Spark read tasks) pays for that per record in Python, which at
small payloads costs as much as the client library's own fetch. ``Consumer.receive_raw``
returns a :class:`RawBatch` instead: payloads and positions as lists, and the backend's own
per-record handle from which ids, properties and timestamps are made only when asked for.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from msgstream_spark.mq.message import Message, MessageID

MSG_TYPE_KEY = "msg_type"  # the property Milvus's msgstream writes the message type into

# (backend handle) -> (properties, hybrid timestamp or None)
PropsOf = Callable[[Any], "tuple[Mapping[str, str], int | None]"]


def _message_props(m: Message) -> tuple[Mapping[str, str], int | None]:
    return m.properties, m.timestamp


class RawBatch:
    """Messages of one channel in read order: ``payloads[i]`` is at ``offsets[i]`` (or ``ids[i]``).

    ``offsets`` holds integer positions where the backend's ids are integer offsets (Kafka, the
    embedded log) and is ``None`` otherwise; ``id(i)`` always gives the :class:`MessageID`.
    """

    __slots__ = ("_handles", "_id_of", "_props_of", "channel", "offsets", "payloads")

    def __init__(self, channel: str, payloads: list[bytes], offsets: list[int] | None, handles: Sequence[Any],
                 id_of: Callable[[int], MessageID], props_of: PropsOf) -> None:
        self.channel = channel
        self.payloads = payloads
        self.offsets = offsets
        self._handles = handles
        self._id_of = id_of
        self._props_of = props_of

    @classmethod
    def of_messages(cls, channel: str, messages: list[Message]) -> RawBatch:
        """The generic form, for backends without a dedicated bulk path."""
        return cls(channel, [m.payload for m in messages], None, messages, lambda i: messages[i].id, _message_props)

    def __len__(self) -> int:
        return len(self.payloads)

    def id(self, i: int) -> MessageID:
        return self._id_of(i)

    def properties(self, i: int) -> Mapping[str, str]:
        return self._props_of(self._handles[i])[0]

    def timestamp(self, i: int) -> int | None:
        return self._props_of(self._handles[i])[1]

    def msg_type(self, i: int) -> str | None:
        """The ``msg_type`` property of message ``i`` (Milvus's type name), if it has one."""
        return self.properties(i).get(MSG_TYPE_KEY)
