"""PulsarClient: producers, consumers, readers, positions and metadata on pulsar-client.

Channel ``c`` is topic ``persistent://<pulsar.tenant>/<pulsar.namespace>/c`` (non-partitioned,
auto-created by the broker). Throwaway reads (Spark tasks, scans, the CLI, the first message,
metadata) use non-durable readers, which the broker drops with their connection; the last
message id and a publish-time seek need a subscription, so they use a ``__msgstream_probe_*``
one that is removed right after the call. Channel listing uses the admin REST API at
``http://<host of pulsar.address>:<pulsar.webport>`` (see admin.py). Every call is bounded by
``pulsar.requestTimeout``.

pulsar-lite (an independent Pulsar-protocol broker) answers get-last-message-id on an empty topic
with ``UnknownError`` instead of an id before the first entry; ``_last_id`` confirms with a
reader that nothing is there and returns None, so "empty" means the same on every broker.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import uuid
from collections.abc import Callable, Iterator
from typing import Any

from msgstream_spark.config import Config
from msgstream_spark.errors import BackendError, BackendTimeoutError
from msgstream_spark.mq.base import Client, Consumer, MessageID, Producer, ProducerMessage, SubscriptionInitialPosition
from msgstream_spark.mq.pulsar.admin import AdminAPIUnavailableError, list_topics
from msgstream_spark.mq.pulsar.consumer import PulsarConsumer, last_id
from msgstream_spark.mq.pulsar.message_id import PulsarMessageID
from msgstream_spark.mq.pulsar.producer import PulsarProducer
from msgstream_spark.mq.pulsar.reader import PulsarReader
from msgstream_spark.mq.pulsar.settings import PulsarSettings

log = logging.getLogger(__name__)

METADATA_TOPIC = "__msgstream_metadata"
_KEEPER = "__msgstream_keep"  # a subscription that never acks, so the broker retains the metadata topic
_EMPTY_WAIT_S = 1.0  # how long a reader at the earliest message waits to confirm a topic is empty


class PulsarClient(Client):
    name = "pulsar"

    def __init__(self, config: Config) -> None:
        self.settings = PulsarSettings(config)
        self._client: Any = None
        self._meta_producer: Any = None
        self._lock = threading.RLock()
        self._closed = False

    def __repr__(self) -> str:
        return f"PulsarClient({self.settings.describe()})"

    def __getstate__(self) -> dict:  # picklable: connections reopen lazily where unpickled
        return {"settings": self.settings}

    def __setstate__(self, state: dict) -> None:
        self.settings = state["settings"]
        self._client, self._meta_producer = None, None
        self._lock = threading.RLock()
        self._closed = False

    # -- plumbing -------------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _errors(self, what: str) -> Iterator[None]:
        """Pulsar exceptions -> our errors, naming the operation and the broker (never the token)."""
        import pulsar

        try:
            yield
        except pulsar.Timeout as exc:
            raise BackendTimeoutError(f"{what}: Pulsar at {self.settings.describe()} did not answer within "
                                      f"pulsar.requestTimeout={self.settings.request_timeout:g}s ({exc})") from exc
        except pulsar.AuthenticationError as exc:
            raise BackendError(f"{what}: authentication to Pulsar at {self.settings.describe()} failed "
                               f"(check pulsar.authPlugin / pulsar.authParams)") from exc
        except (pulsar.ConnectError, pulsar.LookupError) as exc:
            raise BackendTimeoutError(f"{what}: cannot reach Pulsar at {self.settings.describe()} within "
                                      f"pulsar.requestTimeout={self.settings.request_timeout:g}s ({exc})") from exc
        except pulsar.PulsarException as exc:
            raise BackendError(f"{what}: Pulsar at {self.settings.describe()} answered {exc}") from exc

    def _pulsar(self) -> Any:
        import pulsar

        with self._lock:
            if self._closed:
                raise BackendError("the Pulsar client is closed")
            if self._client is None:
                self._client = pulsar.Client(self.settings.service_url, **self.settings.client_kwargs())
            return self._client

    def _subscribe(self, channel: str, subscription: str, position: SubscriptionInitialPosition,
                   queue: int = 1000) -> Any:
        import pulsar

        initial = (pulsar.InitialPosition.Earliest if position == SubscriptionInitialPosition.EARLIEST
                   else pulsar.InitialPosition.Latest)
        with self._errors(f"subscribing {subscription!r} to channel {channel}"):
            return self._pulsar().subscribe(self.settings.topic(channel), subscription,
                                            consumer_type=pulsar.ConsumerType.Exclusive, initial_position=initial,
                                            receiver_queue_size=queue,
                                            # after a seek the client itself drops the sought message
                                            # unless this is set; exclusive seeks skip it in PulsarConsumer
                                            start_message_id_inclusive=True)

    @contextlib.contextmanager
    def _probe(self, channel: str, position: SubscriptionInitialPosition, queue: int = 1000) -> Iterator[list]:
        """A throwaway subscription ``[consumer]``, removed afterwards (the list lets the body resubscribe)."""
        held = [self._subscribe(channel, f"__msgstream_probe_{uuid.uuid4().hex[:12]}", position, queue)]
        try:
            yield held
        finally:
            c = held[0]
            try:
                c.unsubscribe()
            except Exception as exc:  # noqa: BLE001 - best effort; the name says what it was
                log.warning("could not remove probe subscription on channel %s: %s", channel, exc)
                with contextlib.suppress(Exception):
                    c.close()

    # -- SPI ------------------------------------------------------------------------------------------
    def create_producer(self, channel: str) -> Producer:
        import pulsar

        with self._errors(f"creating a producer for channel {channel}"):
            p = self._pulsar().create_producer(
                self.settings.topic(channel), batching_enabled=False,
                compression_type=pulsar.CompressionType.ZSTD,
                send_timeout_millis=int(self.settings.request_timeout * 1000),
                max_pending_messages=10000, block_if_queue_full=False)
        return PulsarProducer(self.settings, channel, p)

    def subscribe(self, channel: str, subscription: str,
                  initial_position: SubscriptionInitialPosition = SubscriptionInitialPosition.EARLIEST) -> Consumer:
        pos = SubscriptionInitialPosition.parse(initial_position)
        return PulsarConsumer(self.settings, channel, subscription, self._subscribe(channel, subscription, pos),
                              reopen=lambda: self._subscribe(channel, subscription, pos),
                              last_id_of=lambda get: self._last_id(channel, get))

    def reader(self, channel: str) -> Consumer:
        """A non-durable reader (see reader.py): nothing stays on the broker, even if we are killed."""
        topic = self.settings.topic(channel)

        def open_reader(start: Any) -> Any:
            with self._errors(f"opening a reader on channel {channel}"):
                return self._pulsar().create_reader(topic, start, start_message_id_inclusive=True,
                                                    receiver_queue_size=1000,
                                                    subscription_role_prefix="__msgstream_reader")

        return PulsarReader(self.settings, channel, open_reader, lambda: self.latest_message_id(channel))

    def earliest_message_id(self) -> MessageID:
        return PulsarMessageID.earliest()

    def bytes_to_message_id(self, data: bytes) -> MessageID:
        return PulsarMessageID.deserialize(bytes(data))

    def id_before(self, last: MessageID, count: int) -> MessageID | None:
        """The entry ``count - 1`` entries before ``last`` in ``last``'s ledger (a ledger's entries are
        numbered 0, 1, ... without gaps; retention drops whole ledgers). ``None`` when the ledger holds no
        more than ``count`` entries: what came before lies in an earlier ledger, whose id no one can tell
        without reading (or an admin API)."""
        if not isinstance(last, PulsarMessageID) or count <= 0 or last.entry + 1 <= count:
            return None
        return PulsarMessageID(last.ledger, last.entry - count + 1)

    def latest_message_id(self, channel: str) -> MessageID | None:
        # Asked only when a query resolves its start or an AvailableNow target, so a throwaway
        # subscription per call (removed at once) is cheap enough and never outlives the call.
        with self._probe(channel, SubscriptionInitialPosition.LATEST, queue=0) as held:
            with self._errors(f"getting the last message id of channel {channel}"):
                return self._last_id(channel, held[0].get_last_message_id)

    def _last_id(self, channel: str, get_last: Callable[[], Any]) -> PulsarMessageID | None:
        """``get_last()``'s answer as our id; None for an empty topic, however the broker says it."""
        import pulsar

        try:
            return last_id(get_last())
        except pulsar.UnknownError:
            if self._holds_a_message(channel):
                raise  # a real failure: the topic is not empty
            return None

    def _holds_a_message(self, channel: str) -> bool:
        """Whether a reader at the earliest message receives one within a short wait."""
        import pulsar

        wait = min(self.settings.request_timeout, _EMPTY_WAIT_S)
        with self._errors(f"opening a reader on channel {channel}"):
            r = self._pulsar().create_reader(self.settings.topic(channel), pulsar.MessageId.earliest,
                                             receiver_queue_size=1, subscription_role_prefix="__msgstream_reader")
        try:
            r.read_next(int(wait * 1000))
            return True
        except pulsar.Timeout:
            return False
        finally:
            with contextlib.suppress(Exception):
                r.close()

    def first_message_id(self, channel: str) -> MessageID | None:
        if self.latest_message_id(channel) is None:
            return None
        r = self.reader(channel)
        try:
            r.seek(PulsarMessageID.earliest())
            got = r.receive_batch(1, self.settings.request_timeout)
            if not got:
                raise BackendTimeoutError(f"channel {channel}: no message arrived within pulsar.requestTimeout="
                                          f"{self.settings.request_timeout:g}s although the channel is not empty")
            return got[0].id
        finally:
            r.close()

    def message_id_at_timestamp(self, channel: str, hybrid_ts: int) -> MessageID | None:
        """Seek by publish time to the physical ms, then forward to the exact hybrid ts."""
        last = self.latest_message_id(channel)
        if last is None:
            return None
        with self._probe(channel, SubscriptionInitialPosition.EARLIEST) as held:
            c = held[0]
            with self._errors(f"seeking channel {channel} to time {int(hybrid_ts) >> 18} ms"):
                c.seek(int(hybrid_ts) >> 18)
            # and resubscribe: some brokers (pulsar-lite) move the cursor without redelivering
            with contextlib.suppress(Exception):
                c.close()
            held[0] = c = self._subscribe(channel, c.subscription_name(), SubscriptionInitialPosition.EARLIEST)
            probe = PulsarConsumer(self.settings, channel, "(probe)", c)  # for its receive path only
            while True:
                batch = probe.receive_batch(256, self.settings.request_timeout)
                if not batch:
                    return None
                for m in batch:
                    if m.timestamp is None or m.timestamp >= hybrid_ts:
                        return m.id
                    if m.id.sort_key() >= last.sort_key():
                        return None

    def list_channels(self) -> list[str]:
        prefix = self.settings.topic("")
        names = (t[len(prefix):] for t in list_topics(self.settings) if t.startswith(prefix))
        return sorted(n for n in names if not n.startswith("__") and "-partition-" not in n)

    def channel_exists(self, channel: str) -> bool:
        """Listed by the admin API; without one (pulsar-lite), a channel exists once it holds a message."""
        try:
            return channel in self.list_channels()
        except AdminAPIUnavailableError:
            return self.latest_message_id(channel) is not None

    # -- metadata: last value per key in a dedicated topic ----------------------------------------------
    def put_metadata(self, key: str, value: str) -> None:
        with self._lock:
            if self._meta_producer is None:
                self._subscribe(METADATA_TOPIC, _KEEPER, SubscriptionInitialPosition.EARLIEST, queue=0).close()
                self._meta_producer = self.create_producer(METADATA_TOPIC)
            producer = self._meta_producer
        producer.send_batch([_meta_message(key, value)])

    def get_metadata(self, key: str) -> str | None:
        last = self.latest_message_id(METADATA_TOPIC)
        if last is None:
            return None
        value = None
        r = self.reader(METADATA_TOPIC)
        try:
            r.seek(PulsarMessageID.earliest())
            while True:
                batch = r.receive_batch(1024, self.settings.request_timeout)
                if not batch:
                    raise BackendTimeoutError(f"reading {METADATA_TOPIC} stalled before its last message {last!r}")
                for m in batch:
                    if m.properties.get("key") == key:
                        value = m.payload.decode()
                    if m.id.sort_key() >= last.sort_key():
                        return value
        finally:
            r.close()

    def commit_position(self, channel: str, subscription: str, msg_id: MessageID) -> None:
        """Acknowledge up to ``msg_id`` on ``subscription`` (best effort: skipped while it is in use)."""
        try:
            c = self._subscribe(channel, subscription, SubscriptionInitialPosition.LATEST, queue=0)
        except BackendError as exc:
            log.info("not recording the position of %s on channel %s: %s", subscription, channel, exc)
            return
        try:
            c.acknowledge_cumulative(PulsarMessageID.deserialize(msg_id.serialize()).to_client())
        finally:
            c.close()

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
        if self._meta_producer is not None:
            with contextlib.suppress(Exception):
                self._meta_producer.close()
        if self._client is not None:
            with contextlib.suppress(Exception):
                self._client.close()


def _meta_message(key: str, value: str):
    return ProducerMessage(value.encode(), {"key": key})
