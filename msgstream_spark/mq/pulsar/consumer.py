"""Pulsar consumer: one Exclusive subscription on the channel's topic.

Unlike Milvus (which unsubscribes on close), ``close`` keeps the subscription so a named
subscription resumes at its cursor. A seek is followed by a check of the first message: when
the sought message is gone (retention removed its ledger) the gap is reported as DataLossError
instead of silently reading later messages.

Brokers differ after a seek: Apache Pulsar disconnects the consumer and redelivers from the new
cursor; pulsar-lite moves the cursor but may not redeliver to the connected consumer. So when
the client gave us a way to resubscribe (``reopen``), a seek closes the consumer and opens it
again under the same subscription, which starts at the moved cursor on every broker.
"""

from __future__ import annotations

import collections
import logging
import time
from collections.abc import Callable
from typing import Any

from msgstream_spark.errors import ConsumeError, DataLossError
from msgstream_spark.mq.base import Consumer, Message, MessageID
from msgstream_spark.mq.pulsar.message_id import PulsarMessageID
from msgstream_spark.mq.pulsar.producer import TS_PROPERTY
from msgstream_spark.mq.pulsar.settings import PulsarSettings

log = logging.getLogger(__name__)

_ACK_EVERY_S = 1.0  # pending in-order acks are sent at least this often while acking
_MAX_TRACKED = 100_000  # delivered, not yet acknowledged messages tracked for collapsing acks


class PulsarConsumer(Consumer):
    def __init__(self, settings: PulsarSettings, channel: str, subscription: str, consumer: Any,
                 reopen: Callable[[], Any] | None = None,
                 last_id_of: Callable[[Callable[[], Any]], MessageID | None] | None = None) -> None:
        """``reopen`` subscribes again (used after a seek); ``last_id_of`` turns a get-last-message-id
        call into our id, knowing the brokers' ways of saying "empty" (default: :func:`last_id`)."""
        self.channel = channel
        self._s = settings
        self._sub = subscription
        self._closed = False
        self._seek: tuple[PulsarMessageID, bool] | None = None  # pending check after a seek
        self.redeliveries_dropped = 0  # redelivered messages this consumer had already handed out
        self._reopen = reopen
        self._last_id_of = last_id_of
        self._bind(consumer)
        # Acks that arrive in delivery order collapse into one cumulative ack per batch (same effect
        # on an Exclusive subscription as acking each, at a fraction of the cost); any other ack is
        # sent individually at once. Only while ids arrive strictly increasing: a redelivery (after
        # a reconnect) or a reader that stops acking turns collapsing off until the next seek.
        self._delivered: collections.deque[PulsarMessageID] = collections.deque()
        self._collapse = True
        self._last_seen: tuple[int, int, int] = (-2, -2, -2)
        self._cum: PulsarMessageID | None = None
        self._last_flush = time.monotonic()
        # The highest (ledger, entry, batch index) handed out since the last seek. A broker redelivers
        # what was not acknowledged yet after a reconnect (pulsar-lite sometimes does without one);
        # the caller already has those messages, so they are dropped, keeping the stream in order and
        # free of duplicates, as a Kafka consumer's in-memory position does.
        self._high: tuple[int, int, int] = (-2, -2, -2)

    def _bind(self, consumer: Any) -> None:
        self._c = consumer
        # The wrapper's inner consumer takes and returns the client's own objects; calling it
        # directly saves a Python wrapper per message (a measurable share of consume time).
        inner = getattr(consumer, "_consumer", consumer)
        self._recv = inner.receive
        self._ack = inner.acknowledge
        self._ack_upto = inner.acknowledge_cumulative

    @property
    def subscription(self) -> str:
        return self._sub

    def _check(self) -> None:
        if self._closed:
            raise ConsumeError(f"consumer of channel {self.channel} ({self._sub}) is closed")

    def _after_seek(self, m: Message) -> bool:
        """Check the first message after a seek; False drops it (the exclusive seek's own message)."""
        target, inclusive = self._seek  # type: ignore[misc]
        got, want = m.id.sort_key(), target.sort_key()
        if got[:2] > want[:2]:
            self._seek = None
            raise DataLossError(f"channel {self.channel}: position {target!r} is no longer retained; the first "
                                f"message available is {m.id!r}", channel=self.channel)
        if got < want or (got == want and not inclusive):
            if got == want:
                self._seek = None
            return False  # before the target (same batch entry) or the excluded message itself
        self._seek = None
        return True

    def receive_batch(self, max_messages: int, timeout: float) -> list[Message]:
        import pulsar

        self._check()
        self._flush_acks()
        out: list[Message] = []
        recv, channel, new_id = self._recv, self.channel, PulsarMessageID
        wait_ms = max(0, int(timeout * 1000))
        while len(out) < max_messages:  # the hot loop: kept flat on purpose
            try:
                raw = recv(wait_ms)
            except pulsar.Timeout:
                break
            except pulsar.PulsarException as exc:
                raise ConsumeError(f"channel {channel} ({self._sub}): receive failed: {exc}") from exc
            wait_ms = 0
            props = raw.properties()
            raw_ts = props.pop(TS_PROPERTY, None)
            if raw_ts is not None:
                ts: int | None = int(raw_ts)
            else:  # not written by us (e.g. by Milvus): the publish time, to the millisecond
                ms = raw.publish_timestamp()
                ts = ms << 18 if ms else None
            cid = raw.message_id()
            key = (cid.ledger_id(), cid.entry_id(), cid.batch_index())
            if key <= self._high:  # a redelivery of a message already handed out
                self.redeliveries_dropped += 1
                continue
            m = Message(channel, raw.data(), props, new_id(key[0], key[1], key[2], 0, cid), ts)
            if self._seek is not None and not self._after_seek(m):
                self._ack(cid)
                wait_ms = max(0, int(timeout * 1000)) if not out else 0
                continue
            self._high = key
            out.append(m)
        if self._collapse and out:
            self._track(out)
        return out

    def _track(self, out: list[Message]) -> None:
        prev = self._last_seen
        for m in out:
            i = m.id
            key = (i.ledger, i.entry, i.batch_index)
            if key <= prev:  # a redelivery: earlier messages may be pending again
                self._stop_collapsing()
                return
            prev = key
        self._last_seen = prev
        self._delivered.extend(m.id for m in out)
        if len(self._delivered) > _MAX_TRACKED:  # the reader does not ack (or acks out of order)
            self._stop_collapsing()

    def _stop_collapsing(self) -> None:
        self._flush_acks()
        self._collapse = False
        self._delivered.clear()

    def receive(self, timeout: float) -> Message | None:
        got = self.receive_batch(1, timeout)
        return got[0] if got else None

    def seek(self, msg_id: MessageID, inclusive: bool = True) -> None:
        import pulsar

        self._check()
        if not isinstance(msg_id, PulsarMessageID):
            msg_id = PulsarMessageID.deserialize(msg_id.serialize())
        earliest = msg_id.ledger < 0
        self._flush_acks()
        self._delivered.clear()
        self._collapse, self._last_seen = True, (-2, -2, -2)  # the broker's cursor restarts at the seek
        self._high = (-2, -2, -2)
        try:
            # the earliest message by publish time 0: pulsar-lite drops the connection on a seek to
            # the earliest-id sentinel, and every broker puts publish time 0 before the first message
            self._c.seek(0 if earliest else msg_id.to_client())
        except pulsar.PulsarException as exc:
            raise ConsumeError(f"channel {self.channel} ({self._sub}): seek to {msg_id!r} failed: {exc}") from exc
        self._resubscribe()
        self._seek = None if earliest else (msg_id, inclusive)

    def _resubscribe(self) -> None:
        """Close and subscribe again: the new consumer starts at the cursor the seek moved."""
        if self._reopen is None:
            return
        old, self._c = self._c, None
        try:
            old.close()
        except Exception as exc:  # noqa: BLE001 - a broker that disconnected us after the seek
            log.debug("closing the consumer of channel %s before resubscribing: %s", self.channel, exc)
        try:
            self._bind(self._reopen())
        except BaseException:
            self._closed = True  # nothing left to receive from or close
            raise

    def ack(self, message: Message) -> None:
        self._check()
        mid = message.id
        if not isinstance(mid, PulsarMessageID):
            raise ConsumeError(f"channel {self.channel}: cannot acknowledge a {type(mid).__name__} on Pulsar")
        if self._collapse and self._delivered and self._delivered[0] is mid:
            self._delivered.popleft()
            self._cum = mid
            if time.monotonic() - self._last_flush > _ACK_EVERY_S:  # a slow reader still advances
                self._flush_acks()
            return
        self._send_ack(self._ack, mid)

    def _flush_acks(self) -> None:
        self._last_flush = time.monotonic()
        if self._cum is not None:
            mid, self._cum = self._cum, None
            self._send_ack(self._ack_upto, mid)

    def _send_ack(self, fn: Any, mid: PulsarMessageID) -> None:
        import pulsar

        try:
            fn(mid.to_client())
        except pulsar.PulsarException as exc:
            raise ConsumeError(f"channel {self.channel} ({self._sub}): acknowledging {mid!r} failed: {exc}") from exc

    def latest_message_id(self) -> MessageID | None:
        import pulsar

        self._check()
        try:
            if self._last_id_of is not None:
                return self._last_id_of(self._c.get_last_message_id)
            return last_id(self._c.get_last_message_id())
        except pulsar.PulsarException as exc:
            raise ConsumeError(f"channel {self.channel}: cannot get the last message id: {exc}") from exc

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._flush_acks()
            self._c.close()  # not unsubscribe: the subscription keeps its cursor
        except Exception as exc:  # noqa: BLE001 - the connection may already be gone; nothing to keep
            log.debug("closing the consumer of channel %s: %s", self.channel, exc)

    def unsubscribe(self) -> None:
        """Remove the subscription on the broker (it would otherwise hold the backlog forever)."""
        if self._closed:
            return
        self._closed = True
        self._cum = None
        try:
            self._c.unsubscribe()
        except Exception as exc:  # noqa: BLE001 - reported, then at least the consumer is released
            log.warning("could not remove subscription %s of channel %s (remove it with pulsar-admin): %s",
                        self._sub, self.channel, exc)
            try:
                self._c.close()
            except Exception as exc2:  # noqa: BLE001
                log.debug("closing the consumer of channel %s: %s", self.channel, exc2)


def last_id(mid: Any) -> PulsarMessageID | None:
    """Our id for a get-last-message-id answer; None when the topic holds no message."""
    if mid.entry_id() < 0 or mid.ledger_id() < 0:
        return None
    return PulsarMessageID(mid.ledger_id(), mid.entry_id(), mid.batch_index())
