"""Kafka consumer: explicit assign + seek on partition 0; group.id = subscription.

Unlike Milvus (which never commits), acks commit offsets for the group, so a named
subscription resumes after a restart and lag tools see progress. With
``auto.offset.reset=error`` a position removed by retention is reported, not skipped.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from msgstream_spark.errors import ConsumeError, DataLossError
from msgstream_spark.mq.base import Consumer, Message, MessageID
from msgstream_spark.mq.batch import RawBatch
from msgstream_spark.mq.kafka.message_id import OFFSET_BEGINNING, KafkaMessageID
from msgstream_spark.mq.kafka.producer import TS_HEADER
from msgstream_spark.mq.kafka.settings import KafkaSettings

_COMMIT_EVERY_S = 1.0

log = logging.getLogger(__name__)


def record_properties(m: Any) -> tuple[dict[str, str], int | None]:
    """A record's properties (its headers but ours) and hybrid timestamp (our header, else the
    record timestamp in milliseconds shifted into a hybrid ts)."""
    props: dict[str, str] = {}
    ts = None
    headers = m.headers()
    if headers:
        for k, v in headers:
            if k == TS_HEADER:
                ts = int(v)
            else:
                props[k] = v.decode("utf-8", "replace") if type(v) is bytes else str(v or "")
    if ts is None:
        ms = m.timestamp()[1]
        ts = ms << 18 if ms and ms > 0 else None
    return props, ts


def fetch(consumer: Any, max_messages: int, timeout: float) -> list:
    """Wait up to ``timeout`` for one message, then take what is already fetched (no more waiting).

    (``Consumer.consume(n, timeout)`` blocks until n messages or the timeout.)
    """
    first = consumer.poll(max(0.0, timeout))
    if first is None:
        return []
    rest = consumer.consume(num_messages=max_messages - 1, timeout=0) if max_messages > 1 else []
    return [first, *rest]


class KafkaConsumer(Consumer):
    def __init__(self, settings: KafkaSettings, channel: str, subscription: str, consumer: Any,
                 start: int | None, fresh: bool = False) -> None:
        """``fresh``: the group is new to the broker (a reader's): until it commits there is nothing to delete."""
        from confluent_kafka import TopicPartition

        self.channel = channel
        self._s = settings
        self._sub = subscription
        self._c = consumer
        self._tp = TopicPartition
        self._assigned = False
        self._acked: int | None = None
        self._committed: int | None = None
        self._fresh = fresh
        self._last_commit = time.monotonic()
        self._closed = False
        if start is not None:
            self._assign(start)

    def mark_fresh(self) -> None:
        """The group is new to the broker (a reader's): until it commits, closing it leaves nothing to delete."""
        self._fresh = True

    @property
    def subscription(self) -> str:
        return self._sub

    def _assign(self, offset: int) -> None:
        self._c.assign([self._tp(self.channel, 0, offset)])
        self._assigned = True

    def _check(self) -> None:
        if self._closed:
            raise ConsumeError(f"consumer of channel {self.channel} ({self._sub}) is closed")
        if not self._assigned:
            raise ConsumeError(f"consumer of channel {self.channel} was subscribed with initial position "
                               "unknown: seek before receiving")

    def _watermarks(self) -> tuple[int, int]:
        from confluent_kafka import KafkaException

        try:
            return self._s.call(f"reading the offsets of {self.channel}",
                                lambda t: self._c.get_watermark_offsets(self._tp(self.channel, 0), timeout=t))
        except KafkaException as exc:
            raise ConsumeError(f"channel {self.channel}: cannot read offsets from {self._s.brokers}: {exc}") from exc

    def receive_raw(self, max_messages: int, timeout: float) -> RawBatch:
        """The fetched records as lists: per record only what the bare client loop reads too."""
        self._check()
        msgs = fetch(self._c, max_messages, timeout)
        payloads: list[bytes] = []
        offsets: list[int] = []
        handles: list = []
        add_payload, add_offset, add_handle = payloads.append, offsets.append, handles.append
        for m in msgs:  # the hot loop: kept flat on purpose
            if m.error() is not None and self._error(m.error()):
                continue
            add_payload(m.value() or b"")
            add_offset(m.offset())
            add_handle(m)
        self._maybe_commit()
        return RawBatch(self.channel, payloads, offsets, handles, lambda i: KafkaMessageID(offsets[i]),
                        record_properties)

    def receive_batch(self, max_messages: int, timeout: float) -> list[Message]:
        self._check()
        msgs = fetch(self._c, max_messages, timeout)
        out: list[Message] = []
        append, channel, new_id = out.append, self.channel, KafkaMessageID
        for m in msgs:  # the hot loop: kept flat on purpose (record_properties inlined)
            if m.error() is not None and self._error(m.error()):
                continue
            props: dict[str, str] = {}
            ts = None
            headers = m.headers()
            if headers:
                for k, v in headers:
                    if k == TS_HEADER:
                        ts = int(v)
                    else:
                        props[k] = v.decode("utf-8", "replace") if type(v) is bytes else str(v or "")
            if ts is None:
                ms = m.timestamp()[1]
                ts = ms << 18 if ms and ms > 0 else None
            append(Message(channel, m.value() or b"", props, new_id(m.offset()), ts))
        self._maybe_commit()
        return out

    def _maybe_commit(self) -> None:
        if self._acked is not None and time.monotonic() - self._last_commit > _COMMIT_EVERY_S:
            self._commit(asynchronous=True)

    def _error(self, err) -> bool:
        """True to skip the message (end of partition); raises for real errors."""
        from confluent_kafka import KafkaError

        code = err.code()
        if code == KafkaError._PARTITION_EOF:
            return True
        if code in (KafkaError._AUTO_OFFSET_RESET, KafkaError.OFFSET_OUT_OF_RANGE):
            raise DataLossError(f"channel {self.channel}: the position read by subscription {self._sub} "
                                f"was removed by retention ({err.str()})", channel=self.channel)
        raise ConsumeError(f"channel {self.channel}: {err.str()}")

    def receive(self, timeout: float) -> Message | None:
        got = self.receive_batch(1, timeout)
        return got[0] if got else None

    def seek(self, msg_id: MessageID, inclusive: bool = True) -> None:
        if self._closed:
            raise ConsumeError(f"consumer of channel {self.channel} ({self._sub}) is closed")
        off = msg_id.offset
        if off < 0:
            self._assign(OFFSET_BEGINNING)
            return
        low, high = self._watermarks()
        if off < low:
            raise DataLossError(f"channel {self.channel}: position {off} was removed by retention "
                                f"(first retained offset: {low})", channel=self.channel)
        if (off if inclusive else off + 1) > high:  # the log is shorter than the position: the broker lost it
            raise DataLossError(f"channel {self.channel}: position {off} is past the end of the log (next offset: "
                                f"{high}); the broker lost messages (e.g. a restarted memory-only broker or a "
                                "recreated topic)", channel=self.channel)
        self._assign(off if inclusive else off + 1)

    def ack(self, message: Message) -> None:
        off = message.id.offset
        if self._acked is None or off > self._acked:
            self._acked = off

    def _commit(self, asynchronous: bool) -> None:
        from confluent_kafka import KafkaException

        self._last_commit = time.monotonic()
        if self._acked is None or self._acked == self._committed:
            return
        try:
            self._c.commit(offsets=[self._tp(self.channel, 0, self._acked + 1)], asynchronous=asynchronous)
            self._committed = self._acked
        except KafkaException as exc:
            if not asynchronous:
                raise ConsumeError(f"channel {self.channel}: committing subscription {self._sub} failed: {exc}") \
                    from exc

    def latest_message_id(self) -> MessageID | None:
        low, high = self._watermarks()
        return KafkaMessageID(high - 1) if high > 0 else None

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._commit(asynchronous=False)
        finally:
            self._c.close()

    def unsubscribe(self) -> None:
        """Close without recording acks, then delete the group's committed offsets (best effort)."""
        from confluent_kafka.admin import AdminClient

        if self._closed:
            return
        self._acked = None
        self.close()
        if self._fresh and self._committed is None:  # the broker holds nothing of this group: no round trip
            return
        try:
            admin = AdminClient(self._s.admin_conf())  # kept referenced until the futures resolve
            futures = admin.delete_consumer_groups([self._sub], request_timeout=self._s.request_timeout)
            for fut in futures.values():
                fut.result(self._s.request_timeout)
        except Exception as exc:  # noqa: BLE001 - e.g. a group that never committed does not exist
            log.debug("deleting consumer group %s: %r", self._sub, exc)
