"""Kafka producer: partition 0, headers = properties, record timestamp from the hybrid ts."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from msgstream_spark.errors import ProduceError
from msgstream_spark.mq.base import MessageID, Producer, ProducerMessage
from msgstream_spark.mq.kafka.message_id import KafkaMessageID
from msgstream_spark.mq.kafka.settings import KafkaSettings

TS_HEADER = "msgstream_ts"  # exact hybrid ts (record timestamps keep only milliseconds)


class KafkaProducer(Producer):
    def __init__(self, settings: KafkaSettings, channel: str, producer: Any) -> None:
        self.channel = channel
        self._s = settings
        self._p = producer
        self._closed = False

    def send(self, message: ProducerMessage) -> MessageID:
        return self.send_batch([message])[0]

    def send_batch(self, messages: Sequence[ProducerMessage]) -> list[MessageID]:
        if self._closed:
            raise ProduceError(f"producer of channel {self.channel} is closed", channel=self.channel)
        n = len(messages)
        ids: list[MessageID | None] = [None] * n
        errors: dict[int, str] = {}
        reports: list = []  # one partition + idempotence: delivery reports arrive in send order

        def on_delivery(err, msg) -> None:
            reports.append((err, msg.offset() if err is None else -1))

        deadline = time.monotonic() + self._s.request_timeout
        sent: list[int] = []  # indices handed to librdkafka, in order
        produce, topic = self._p.produce, self.channel
        for i, m in enumerate(messages):  # the hot loop: one produce call per message, nothing else
            props, payload = m.properties, m.payload
            if type(payload) is not bytes:
                payload = bytes(payload)
            if m.timestamp is None:
                headers = props if isinstance(props, dict) else dict(props)
                ts = 0
            else:
                headers = {**props, TS_HEADER: str(int(m.timestamp))}
                ts = int(m.timestamp) >> 18
            try:
                produce(topic, payload, partition=0, on_delivery=on_delivery, timestamp=ts, headers=headers)
                sent.append(i)
            except BufferError:  # local queue full: let deliveries drain, then retry (bounded)
                if self._retry_full(payload, on_delivery, ts, headers, deadline):
                    sent.append(i)
                else:
                    errors[i] = "local producer queue stayed full"
                    break
            except Exception as exc:  # noqa: BLE001 - e.g. message too large: reported per message
                errors[i] = str(exc)
                break
        remaining = self._p.flush(max(0.0, deadline - time.monotonic()))
        for i, (err, off) in zip(sent, reports):
            if err is not None:
                errors[i] = str(err)
            else:
                ids[i] = KafkaMessageID(off)
        if remaining or len(reports) < len(sent):
            for i in range(n):
                if ids[i] is None and i not in errors:
                    errors[i] = (f"no delivery report within kafka.requestTimeout={self._s.request_timeout:g}s "
                                 f"(brokers: {self._s.brokers})")
        self._check_failures(errors, n, ids)
        return ids  # type: ignore[return-value]

    def _retry_full(self, payload, on_delivery, ts: int, headers, deadline: float) -> bool:
        while time.monotonic() < deadline:
            self._p.poll(0.05)
            try:
                self._p.produce(self.channel, payload, partition=0, on_delivery=on_delivery, timestamp=ts,
                                headers=headers)
                return True
            except BufferError:
                continue
        return False

    def flush(self, timeout: float | None = None) -> None:
        self._p.flush(self._s.request_timeout if timeout is None else timeout)

    def close(self) -> None:
        if not self._closed:
            self._closed = True
            self._p.flush(self._s.request_timeout)
