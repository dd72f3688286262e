"""A non-durable Pulsar reader behind the Consumer API (``PulsarClient.reader``).

Spark read tasks, the streaming source's scans, schema inference and the CLI read without
resuming. A durable subscription left behind by a killed process would hold the topic's
backlog forever; a reader's subscription is non-durable and disappears with its connection.
The reader is opened at the first ``seek`` (and reopened at later ones, which is cheaper than
a broker-side seek); it always starts inclusive, so the first-message check of
``PulsarConsumer`` reports a position that retention removed and skips an excluded one.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

from msgstream_spark.errors import ConsumeError
from msgstream_spark.mq.base import Message, MessageID
from msgstream_spark.mq.pulsar.consumer import PulsarConsumer
from msgstream_spark.mq.pulsar.message_id import PulsarMessageID
from msgstream_spark.mq.pulsar.settings import PulsarSettings


class PulsarReader(PulsarConsumer):
    def __init__(self, settings: PulsarSettings, channel: str, open_reader: Callable[[Any], Any],
                 latest: Callable[[], MessageID | None]) -> None:
        super().__init__(settings, channel, "(non-durable reader)", _Unpositioned(channel))
        self._c = None  # no reader until the first seek
        self._collapse = False  # a reader records no position: nothing to acknowledge
        self._open = open_reader
        self._latest = latest

    def seek(self, msg_id: MessageID, inclusive: bool = True) -> None:
        import pulsar

        self._check()
        if not isinstance(msg_id, PulsarMessageID):
            msg_id = PulsarMessageID.deserialize(msg_id.serialize())
        earliest = msg_id.ledger < 0
        self._release()
        self._c = self._open(pulsar.MessageId.earliest if earliest else msg_id.to_client())
        self._recv = getattr(self._c, "_reader", self._c).read_next
        self._seek = None if earliest else (msg_id, inclusive)
        self._high = (-2, -2, -2)  # a new reader: nothing handed out from it yet

    def ack(self, message: Message) -> None:
        self._check()  # a reader records no position

    def latest_message_id(self) -> MessageID | None:
        self._check()
        return self._latest()

    def _release(self) -> None:
        if self._c is not None:
            c, self._c = self._c, None
            with contextlib.suppress(Exception):  # the connection may already be gone; nothing is kept
                c.close()

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._release()

    def unsubscribe(self) -> None:
        self.close()  # the broker drops a non-durable subscription with its reader


class _Unpositioned:
    """Stands in for the client object before the first seek: receiving is an error, acks do nothing."""

    def __init__(self, channel: str) -> None:
        self.channel = channel

    def receive(self, timeout_ms: int) -> Any:
        raise ConsumeError(f"reader of channel {self.channel}: seek before receiving")

    def acknowledge(self, _mid: Any) -> None:
        return None

    acknowledge_cumulative = acknowledge
