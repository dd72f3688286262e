"""KafkaClient: producers, consumers, offsets and topic management on confluent-kafka.

Config: ``kafka.*`` keys (see settings.py). Connections open lazily; every broker call is
bounded by ``kafka.requestTimeout`` so an unreachable broker is a clear error, not a hang.
"""

from __future__ import annotations

import logging
import threading
import uuid
from typing import Any

from msgstream_spark.config import Config
from msgstream_spark.errors import BackendError, BackendTimeoutError, ChannelNotFoundError, ConsumeError
from msgstream_spark.mq.base import Client, Consumer, MessageID, Producer, SubscriptionInitialPosition
from msgstream_spark.mq.kafka.consumer import KafkaConsumer, fetch
from msgstream_spark.mq.kafka.message_id import OFFSET_BEGINNING, KafkaMessageID
from msgstream_spark.mq.kafka.producer import KafkaProducer
from msgstream_spark.mq.kafka.settings import KafkaSettings

log = logging.getLogger(__name__)

METADATA_TOPIC = "__msgstream_metadata"


class KafkaClient(Client):
    name = "kafka"

    def __init__(self, config: Config) -> None:
        self.settings = KafkaSettings(config)
        self._producer: Any = None  # one librdkafka producer per client, shared by channels (as Milvus)
        self._admin: Any = None
        self._probe: Any = None
        self._known: set[str] = set()
        self._lock = threading.Lock()
        self._closed = False

    def __repr__(self) -> str:
        return f"KafkaClient({self.settings.describe()})"

    # -- lazily opened handles ------------------------------------------------------------
    def _admin_client(self) -> Any:
        from confluent_kafka.admin import AdminClient

        if self._admin is None:
            self._admin = AdminClient(self.settings.admin_conf())
        return self._admin

    def _probe_consumer(self) -> Any:
        from confluent_kafka import Consumer as CKConsumer

        if self._probe is None:
            self._probe = CKConsumer(self.settings.consumer_conf(f"msgstream-probe-{uuid.uuid4().hex[:8]}"))
        return self._probe

    def _shared_producer(self) -> Any:
        from confluent_kafka import Producer as CKProducer

        with self._lock:
            if self._producer is None:
                self._producer = CKProducer(self.settings.producer_conf())
            return self._producer

    def _topics(self) -> dict:
        from confluent_kafka import KafkaException

        try:
            admin = self._admin_client()
            try:
                return self.settings.call("listing Kafka topics", lambda t: admin.list_topics(timeout=t).topics)
            finally:
                admin.poll(0)  # hands librdkafka's queued log lines to Python logging
        except KafkaException as exc:
            raise BackendTimeoutError(f"Kafka brokers {self.settings.brokers} did not answer within "
                                      f"kafka.requestTimeout={self.settings.request_timeout:g}s: {exc}") from exc

    def ensure_channel(self, channel: str, *, compact: bool = False) -> None:
        """Create the topic (one partition by default) unless it exists."""
        if channel in self._known:
            return
        topics = self._topics()
        if channel in topics and not topics[channel].error:
            self._known.add(channel)
            return
        if not self.settings.create_topics:
            raise ChannelNotFoundError(f"Kafka topic {channel!r} does not exist and kafka.createTopics is false")
        from confluent_kafka import KafkaError, KafkaException
        from confluent_kafka.admin import NewTopic

        cfg = {"cleanup.policy": "compact"} if compact else {}
        fut = self._admin_client().create_topics(
            [NewTopic(channel, num_partitions=self.settings.partitions,
                      replication_factor=self.settings.replication, config=cfg)],
            request_timeout=self.settings.request_timeout)[channel]
        try:
            fut.result(timeout=self.settings.request_timeout)
        except KafkaException as exc:
            err = exc.args[0] if exc.args else None
            if not (err is not None and getattr(err, "code", lambda: None)() == KafkaError.TOPIC_ALREADY_EXISTS):
                raise ChannelNotFoundError(f"Kafka topic {channel!r} does not exist and could not be created "
                                           f"on {self.settings.brokers}: {exc}") from exc
        except Exception as exc:  # noqa: BLE001 - futures time out with concurrent.futures errors
            raise BackendTimeoutError(f"creating Kafka topic {channel!r} timed out: {exc}") from exc
        self._known.add(channel)

    # -- SPI ---------------------------------------------------------------------------------
    def _check(self) -> None:
        if self._closed:
            raise BackendError("the Kafka client is closed")

    def create_producer(self, channel: str) -> Producer:
        self._check()
        self.ensure_channel(channel)
        return KafkaProducer(self.settings, channel, self._shared_producer())

    def subscribe(self, channel: str, subscription: str,
                  initial_position: SubscriptionInitialPosition = SubscriptionInitialPosition.EARLIEST) -> Consumer:
        from confluent_kafka import Consumer as CKConsumer
        from confluent_kafka import KafkaException, TopicPartition

        self._check()
        pos = SubscriptionInitialPosition.parse(initial_position)
        self.ensure_channel(channel)
        c = CKConsumer(self.settings.consumer_conf(subscription))
        try:
            committed = self.settings.call(f"reading the committed offset of {subscription} on {channel}",
                                           lambda t: c.committed([TopicPartition(channel, 0)], timeout=t))[0].offset
        except KafkaException as exc:
            c.close()
            raise ConsumeError(f"channel {channel}: cannot read the committed offset of {subscription}: {exc}") \
                from exc
        except BaseException:
            c.close()
            raise
        if committed >= 0:
            start: int | None = committed
        elif pos == SubscriptionInitialPosition.EARLIEST:
            start = OFFSET_BEGINNING
        elif pos == SubscriptionInitialPosition.LATEST:
            start = self.settings.call(f"reading the offsets of {channel}", lambda t: c.get_watermark_offsets(
                TopicPartition(channel, 0), timeout=t))[1]
        else:
            start = None
        return KafkaConsumer(self.settings, channel, subscription, c, start)

    def reader(self, channel: str) -> Consumer:
        """A consumer of a new random group: nothing to delete when it goes unless it committed. (Its committed
        offset is still looked up: that round trip also finds the group's coordinator, without which the first
        fetch waited ~0.5 s on tansu.)"""
        consumer = self.subscribe(channel, f"__msgstream-reader-{uuid.uuid4().hex[:12]}",
                                  SubscriptionInitialPosition.UNKNOWN)
        consumer.mark_fresh()
        return consumer

    def earliest_message_id(self) -> MessageID:
        return KafkaMessageID(OFFSET_BEGINNING)

    def message_id_from_offset(self, offset: int) -> MessageID:
        return KafkaMessageID(offset)

    def bytes_to_message_id(self, data: bytes) -> MessageID:
        return KafkaMessageID.deserialize(data)

    def _watermarks(self, channel: str) -> tuple[int, int]:
        from confluent_kafka import KafkaException, TopicPartition

        self._check()
        try:
            probe = self._probe_consumer()
            return self.settings.call(f"reading the offsets of {channel}", lambda t: probe.get_watermark_offsets(
                TopicPartition(channel, 0), timeout=t))
        except KafkaException as exc:
            raise ConsumeError(f"channel {channel}: cannot read offsets from {self.settings.brokers}: {exc}") from exc

    def latest_message_id(self, channel: str) -> MessageID | None:
        low, high = self._watermarks(channel)
        return KafkaMessageID(high - 1) if high > 0 else None

    def first_message_id(self, channel: str) -> MessageID | None:
        low, high = self._watermarks(channel)
        return KafkaMessageID(low) if high > low else None

    def message_id_at_timestamp(self, channel: str, hybrid_ts: int) -> MessageID | None:
        """offsets_for_times on the physical ms, then forward to the exact hybrid ts."""
        from confluent_kafka import TopicPartition

        self._check()
        tp = TopicPartition(channel, 0, int(hybrid_ts) >> 18)
        probe = self._probe_consumer()
        found = self.settings.call(f"looking up a time on {channel}",
                                   lambda t: probe.offsets_for_times([tp], timeout=t))[0].offset
        low, high = self._watermarks(channel)
        if found < 0 or found >= high:
            return None
        cons = self.subscribe(channel, f"msgstream-ts-{uuid.uuid4().hex[:8]}", SubscriptionInitialPosition.UNKNOWN)
        try:
            cons.seek(KafkaMessageID(found), inclusive=True)
            while True:
                batch = cons.receive_batch(256, self.settings.read_timeout)
                if not batch:
                    return None
                for m in batch:
                    if m.timestamp is None or m.timestamp >= hybrid_ts:
                        return m.id
                    if m.id.offset >= high - 1:
                        return None
        finally:
            cons._acked = None  # a probe: nothing to commit
            cons.close()

    def list_channels(self) -> list[str]:
        return sorted(t for t in self._topics() if not t.startswith("__"))

    def channel_exists(self, channel: str) -> bool:
        t = self._topics().get(channel)
        return t is not None and not t.error

    # -- metadata: a compacted topic, last value per key wins -----------------------------------------
    def put_metadata(self, key: str, value: str) -> None:
        self._check()
        self.ensure_channel(METADATA_TOPIC, compact=True)
        p = self._shared_producer()
        errors: list[str] = []
        p.produce(METADATA_TOPIC, key=key.encode(), value=value.encode(), partition=0,
                  on_delivery=lambda err, msg: errors.append(str(err)) if err else None)
        if p.flush(self.settings.request_timeout) or errors:
            raise BackendError(f"could not store metadata {key!r} in {METADATA_TOPIC}: {errors or 'timeout'}")

    def get_metadata(self, key: str) -> str | None:
        from confluent_kafka import Consumer as CKConsumer
        from confluent_kafka import TopicPartition

        self._check()
        self.ensure_channel(METADATA_TOPIC, compact=True)
        low, high = self._watermarks(METADATA_TOPIC)
        if high <= low:
            return None
        c = CKConsumer(self.settings.consumer_conf(f"msgstream-meta-{uuid.uuid4().hex[:8]}"))
        value = None
        want = key.encode()
        try:
            c.assign([TopicPartition(METADATA_TOPIC, 0, low)])
            pos = low
            while pos < high:
                batch = fetch(c, 1024, self.settings.read_timeout)
                if not batch:
                    raise BackendTimeoutError(f"reading {METADATA_TOPIC} stalled at offset {pos} of {high}")
                for m in batch:
                    if m.error():
                        continue
                    pos = m.offset() + 1
                    if m.key() == want:
                        value = (m.value() or b"").decode()
        finally:
            c.close()
        return value

    def commit_position(self, channel: str, subscription: str, msg_id: MessageID) -> None:
        from confluent_kafka import Consumer as CKConsumer
        from confluent_kafka import TopicPartition

        c = CKConsumer(self.settings.consumer_conf(subscription))
        try:
            c.commit(offsets=[TopicPartition(channel, 0, msg_id.offset + 1)], asynchronous=False)
        finally:
            c.close()

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._producer is not None:
            self._producer.flush(self.settings.request_timeout)
        if self._probe is not None:
            self._probe.close()
