"""The backend SPI, modelled on Milvus's ``mqwrapper`` (Client, Producer, Consumer, MessageID).

Every backend (``local``, ``kafka``, ``pulsar``) implements these classes in its own
subpackage with the same file names. The stream layer above only ever sees this API.

Conventions shared by every backend:

* A *channel* is one topic (Kafka partition 0, one Pulsar topic, one embedded log).
* ``MessageID.serialize()`` yields exactly the bytes Milvus stores in ``MsgPosition.msgID``.
* ``Consumer.seek(id, inclusive=False)`` positions at ``id`` and skips exactly that message.
* No call blocks forever: every blocking call takes or inherits a bounded timeout and
  raises :class:`~msgstream_spark.errors.BackendTimeoutError` (or returns ``None`` for receive).
* Seeking to a position that retention removed raises
  :class:`~msgstream_spark.errors.DataLossError`, never silently jumps.
"""

from __future__ import annotations

import abc
import enum
import uuid
from collections.abc import Iterator, Mapping, Sequence

from msgstream_spark.errors import ConfigError, ProduceError
from msgstream_spark.mq.batch import RawBatch
from msgstream_spark.mq.message import Message, MessageID, ProducerMessage

__all__ = ["Client", "Consumer", "Message", "MessageID", "Producer", "ProducerMessage", "SubscriptionInitialPosition"]


class SubscriptionInitialPosition(enum.IntEnum):
    """Where a new subscription starts (Milvus's enum values)."""

    LATEST = 0
    EARLIEST = 1
    UNKNOWN = 2  # do not position: a seek follows

    @classmethod
    def parse(cls, value: str | int | SubscriptionInitialPosition) -> SubscriptionInitialPosition:
        if isinstance(value, SubscriptionInitialPosition):
            return value
        if isinstance(value, int):
            return cls(value)
        try:
            return cls[str(value).strip().upper()]
        except KeyError:
            raise ConfigError(
                f"unknown initial position {value!r}; expected one of: earliest, latest, unknown"
            ) from None


class Producer(abc.ABC):
    """Writes to one channel."""

    channel: str

    @abc.abstractmethod
    def send(self, message: ProducerMessage) -> MessageID:
        """Send one message and wait for the broker's ack; return its id."""

    def send_batch(self, messages: Sequence[ProducerMessage]) -> list[MessageID]:
        """Send many messages, keeping their order, and wait for all acks.

        Raises :class:`~msgstream_spark.errors.ProduceError` listing every failed
        message (``failures``) and the ids of those written (``ids``).
        Backends override this with a pipelined implementation.
        """

        ids: list[MessageID | None] = []
        failures: list[tuple[int, str]] = []
        for i, m in enumerate(messages):
            if failures:  # keep order: nothing after a failure is sent
                failures.append((i, "not sent: an earlier message of the batch failed"))
                ids.append(None)
                continue
            try:
                ids.append(self.send(m))
            except Exception as exc:  # noqa: BLE001 - reported per message below
                failures.append((i, str(exc)))
                ids.append(None)
        if failures:
            raise ProduceError(
                f"{len(failures)} of {len(messages)} messages failed on channel {self.channel}: "
                f"first error: {failures[0][1]}",
                channel=self.channel, failures=failures, ids=ids,
            )
        return ids  # type: ignore[return-value]

    def _check_failures(self, errors: Mapping[int, str], n: int, ids: list) -> None:
        """Raise ProduceError for the batch's failed messages (index -> reason), if any."""

        if errors:
            failures = sorted(errors.items())
            raise ProduceError(
                f"{len(failures)} of {n} messages failed on channel {self.channel}: first error: {failures[0][1]}",
                channel=self.channel, failures=failures, ids=ids)

    def flush(self, timeout: float | None = None) -> None:  # noqa: B027 - optional hook
        """Wait until everything sent has been acknowledged."""

    @abc.abstractmethod
    def close(self) -> None:
        """Flush and release resources."""

    def __enter__(self) -> Producer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Consumer(abc.ABC):
    """Reads one channel under a subscription."""

    channel: str

    @property
    @abc.abstractmethod
    def subscription(self) -> str:
        """The subscription (Kafka ``group.id`` / Pulsar subscription) name."""

    @abc.abstractmethod
    def receive(self, timeout: float) -> Message | None:
        """The next message, or ``None`` when none arrives within ``timeout`` seconds."""

    def receive_batch(self, max_messages: int, timeout: float) -> list[Message]:
        """Up to ``max_messages`` messages; waits at most ``timeout`` for the first one.

        Returns early (possibly empty) when no more messages are immediately available.
        Backends override this with a vectorised fetch.
        """
        out: list[Message] = []
        first = self.receive(timeout)
        if first is None:
            return out
        out.append(first)
        while len(out) < max_messages:
            m = self.receive(0.0)
            if m is None:
                break
            out.append(m)
        return out

    def receive_raw(self, max_messages: int, timeout: float) -> RawBatch:
        """Like :meth:`receive_batch`, as parallel lists (payloads, positions) for bulk readers.

        Ids, properties and timestamps are made per message only when asked for. Backends with
        a cheaper bulk fetch override this; the default wraps :meth:`receive_batch`.
        """
        return RawBatch.of_messages(self.channel, self.receive_batch(max_messages, timeout))

    def iterate(self, timeout: float) -> Iterator[Message]:
        """Yield messages until none arrives for ``timeout`` seconds."""
        while True:
            m = self.receive(timeout)
            if m is None:
                return
            yield m

    @abc.abstractmethod
    def seek(self, msg_id: MessageID, inclusive: bool = True) -> None:
        """Position at ``msg_id``; when not inclusive, skip exactly that message.

        Raises :class:`~msgstream_spark.errors.DataLossError` when ``msg_id`` was
        removed by retention.
        """

    @abc.abstractmethod
    def ack(self, message: Message) -> None:
        """Acknowledge a message (advances the subscription where the backend keeps one)."""

    @abc.abstractmethod
    def latest_message_id(self) -> MessageID | None:
        """Id of the last message in the channel, or ``None`` when it is empty."""

    @abc.abstractmethod
    def close(self) -> None:
        """Release resources. A named subscription keeps its cursor."""

    def unsubscribe(self) -> None:
        """Close and remove the subscription (throwaway readers: probes, Spark read tasks, the CLI).

        On Pulsar a subscription left behind holds the topic's backlog forever, so every
        reader that does not need to resume ends this way. Acks not yet recorded are dropped.
        """
        self.close()

    def __enter__(self) -> Consumer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Client(abc.ABC):
    """Entry point of a backend: creates producers and consumers.

    Constructors store configuration only; connections open lazily.
    """

    name: str = "?"
    # Whether each channel's messages come sorted by their Milvus time, without TimeTicks (as Milvus's
    # consumer releases them): a message at time t means no older one follows. Brokers deliver in write order.
    time_ordered: bool = False

    @abc.abstractmethod
    def create_producer(self, channel: str) -> Producer:
        """A producer for ``channel`` (created if the backend needs it)."""

    @abc.abstractmethod
    def subscribe(
        self,
        channel: str,
        subscription: str,
        initial_position: SubscriptionInitialPosition = SubscriptionInitialPosition.EARLIEST,
    ) -> Consumer:
        """A consumer on ``channel``. An existing subscription resumes at its cursor."""

    def reader(self, channel: str) -> Consumer:
        """A consumer that records nothing on the broker (Spark tasks, scans, probes, the CLI).

        It starts unpositioned: ``seek`` first. Acks are no-ops where the backend keeps no
        subscription for it. Backends whose subscriptions are broker state (Pulsar) return a
        non-durable reader that disappears with its connection, even if the process is killed;
        the others return a fresh subscription that stores nothing unless acked.
        """
        return self.subscribe(channel, f"__msgstream-reader-{uuid.uuid4().hex[:12]}",
                              SubscriptionInitialPosition.UNKNOWN)

    @abc.abstractmethod
    def earliest_message_id(self) -> MessageID:
        """The sentinel id that means "from the beginning" (Milvus's EarliestMessageID)."""

    @abc.abstractmethod
    def bytes_to_message_id(self, data: bytes) -> MessageID:
        """Inverse of ``MessageID.serialize`` (raises DecodeError on malformed bytes)."""

    def message_id_from_offset(self, offset: int) -> MessageID | None:
        """The id at integer ``offset``, for backends whose ids are contiguous integer offsets.

        A capability: where it is not ``None`` an id range can be split into pieces (the Spark
        source's ``minPartitions``). ``MessageID.offset`` is the inverse.
        """
        return None

    def id_before(self, last: MessageID, count: int) -> MessageID | None:
        """An id about ``count`` messages before ``last`` from which reading forward reaches ``last`` through
        the channel's newest messages only, where the backend can address one without reading (a capability
        for ids that are not offsets: Pulsar's entries within a ledger); ``None`` where it cannot."""
        return None

    @abc.abstractmethod
    def latest_message_id(self, channel: str) -> MessageID | None:
        """Id of the last message of ``channel``, ``None`` if empty."""

    def collection_schema(self, collection: str | None) -> tuple[bytes, int] | None:
        """(serialized ``CollectionSchema``, collection id) of ``collection`` (a name or an id; ``None``: the
        backend's only one) as the cluster describes it now; ``None`` where the backend cannot tell (it
        holds messages, not collections: all but ``milvus``)."""
        return None

    @abc.abstractmethod
    def first_message_id(self, channel: str) -> MessageID | None:
        """Id of the oldest retained message of ``channel``, ``None`` if empty."""

    @abc.abstractmethod
    def message_id_at_timestamp(self, channel: str, hybrid_ts: int) -> MessageID | None:
        """Id of the first message whose timestamp is >= ``hybrid_ts``; ``None`` if none."""

    @abc.abstractmethod
    def list_channels(self) -> list[str]:
        """Channels known to the backend (for pattern subscriptions and tooling)."""

    def channel_exists(self, channel: str) -> bool:
        return channel in self.list_channels()

    # Small key/value store kept in the backend, used by the Spark source to record
    # resolved start positions under its subscription (deterministic initialOffset).
    @abc.abstractmethod
    def put_metadata(self, key: str, value: str) -> None:
        """Store ``value`` under ``key`` durably in the backend."""

    @abc.abstractmethod
    def get_metadata(self, key: str) -> str | None:
        """The value last stored under ``key``, or ``None``."""

    def commit_position(self, channel: str, subscription: str, msg_id: MessageID) -> None:  # noqa: B027
        """Record progress of ``subscription`` on ``channel`` so lag tools see it.

        Best effort and optional: correctness never depends on it.
        """

    @abc.abstractmethod
    def close(self) -> None:
        """Release connections."""

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
