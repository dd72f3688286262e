"""Pulsar producer: batching off, ZSTD, properties = message properties (as Milvus's producer).

``send_batch`` pipelines with ``send_async`` and waits for every receipt, bounded by
``pulsar.requestTimeout``; failures are reported per message, in order.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

from msgstream_spark.errors import ProduceError
from msgstream_spark.mq.base import MessageID, Producer, ProducerMessage
from msgstream_spark.mq.pulsar.message_id import PulsarMessageID
from msgstream_spark.mq.pulsar.settings import PulsarSettings

TS_PROPERTY = "msgstream_ts"  # exact hybrid ts; the event time keeps only its milliseconds


class PulsarProducer(Producer):
    def __init__(self, settings: PulsarSettings, channel: str, producer: Any) -> None:
        self.channel = channel
        self._s = settings
        self._p = producer
        self._closed = False

    def send(self, message: ProducerMessage) -> MessageID:
        return self.send_batch([message])[0]

    def send_batch(self, messages: Sequence[ProducerMessage]) -> list[MessageID]:
        import pulsar

        if self._closed:
            raise ProduceError(f"producer of channel {self.channel} is closed", channel=self.channel)
        n = len(messages)
        ids: list[MessageID | None] = [None] * n
        errors: dict[int, str] = {}
        done = threading.Semaphore(0)
        handed = got = 0

        def callback_for(i: int):
            def on_receipt(result, mid) -> None:
                if result == pulsar.Result.Ok:
                    ids[i] = PulsarMessageID(mid.ledger_id(), mid.entry_id(), mid.batch_index())
                else:
                    errors[i] = str(result)
                done.release()
            return on_receipt

        limit = self._s.max_message_size
        for i, m in enumerate(messages):
            if limit and len(m.payload) > limit:
                errors[i] = (f"message {i} is {len(m.payload)} bytes, over pulsar.maxMessageSize={limit} "
                             "(split it, or raise the limit on the broker and in the config)")
                for j in range(i + 1, n):
                    errors[j] = "not sent: an earlier message of the batch failed"
                break
            props, kwargs = _send_args(m)
            deadline = time.monotonic() + self._s.request_timeout
            while True:
                try:
                    self._p.send_async(bytes(m.payload), callback_for(i), properties=props, **kwargs)
                    handed += 1
                    break
                except pulsar.ProducerQueueIsFull:  # wait for a receipt to free a slot (bounded)
                    if not done.acquire(timeout=max(0.0, deadline - time.monotonic())):
                        errors[i] = "the producer queue stayed full for pulsar.requestTimeout"
                        break
                    got += 1
                except Exception as exc:  # noqa: BLE001 - e.g. message too large: reported per message
                    errors[i] = str(exc)
                    break
            if i in errors:
                for j in range(i + 1, n):
                    errors[j] = "not sent: an earlier message of the batch failed"
                break
        deadline = time.monotonic() + self._s.request_timeout
        while got < handed and done.acquire(timeout=max(0.0, deadline - time.monotonic())):
            got += 1
        if got < handed:
            for i in range(n):
                if ids[i] is None and i not in errors:
                    errors[i] = (f"no receipt within pulsar.requestTimeout={self._s.request_timeout:g}s "
                                 f"({self._s.describe()})")
        self._check_failures(errors, n, ids)
        return ids  # type: ignore[return-value]

    def flush(self, timeout: float | None = None) -> None:
        if not self._closed:
            self._p.flush()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._p.flush()
        finally:
            self._p.close()


def _send_args(m: ProducerMessage) -> tuple[dict[str, str], dict[str, Any]]:
    """Properties (with the exact hybrid timestamp) and send_async keyword arguments of a message."""
    props = {k: str(v) for k, v in m.properties.items()} if m.properties else {}
    kwargs: dict[str, Any] = {}
    if m.timestamp is not None:
        props[TS_PROPERTY] = str(int(m.timestamp))
        kwargs["event_timestamp"] = max(1, int(m.timestamp) >> 18)
    return props, kwargs
