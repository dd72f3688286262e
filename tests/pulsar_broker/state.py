"""Topics, subscriptions and cursors of the test broker (touched only from the broker's event loop).

A topic is one ledger of entries (entry id = index). A subscription is a cursor: a mark-delete
position (every entry up to it is acknowledged), individually acknowledged entries past it,
a read position, and entries to deliver again (after a consumer left or asked for redelivery).
"""

from __future__ import annotations

import itertools
from collections.abc import Callable
from dataclasses import dataclass, field

from tests.pulsar_broker import protocol as p

_ledgers = itertools.count(101)


@dataclass
class Entry:
    blob: bytes  # [metadata size][MessageMetadata][payload], as the producer sent it
    crc: int
    publish_time: int
    num_messages: int


@dataclass(eq=False)
class ConsumerState:
    consumer_id: int
    name: str
    sub: Subscription
    send: Callable[[bytes], None]  # writes a frame to the consumer's connection
    permits: int = 0
    pending: set[int] = field(default_factory=set)  # delivered, not acknowledged


@dataclass(eq=False)
class Subscription:
    name: str
    topic: Topic
    sub_type: int
    durable: bool
    mark_delete: int = -1
    acked: set[int] = field(default_factory=set)
    read_pos: int = 0
    redeliver: set[int] = field(default_factory=set)
    consumers: list[ConsumerState] = field(default_factory=list)

    def reset(self, index: int) -> None:
        """Position the cursor so that entry ``index`` is the next one read."""
        index = max(0, min(index, len(self.topic.entries)))
        self.mark_delete = index - 1
        self.acked.clear()
        self.redeliver.clear()
        self.read_pos = index
        for c in self.consumers:
            c.pending.clear()

    def ack(self, index: int, cumulative: bool) -> None:
        if cumulative:
            if index > self.mark_delete:
                self.mark_delete = index
                self.acked = {i for i in self.acked if i > index}
        elif index > self.mark_delete:
            self.acked.add(index)
        while self.mark_delete + 1 in self.acked:
            self.mark_delete += 1
            self.acked.discard(self.mark_delete)
        for c in self.consumers:
            if cumulative:
                c.pending = {i for i in c.pending if i > index}
            else:
                c.pending.discard(index)

    def done(self, index: int) -> bool:
        return index <= self.mark_delete or index in self.acked

    def detach(self, consumer: ConsumerState) -> None:
        """A consumer left: what it was given and did not acknowledge is delivered again."""
        if consumer in self.consumers:
            self.consumers.remove(consumer)
        self.redeliver |= {i for i in consumer.pending if not self.done(i)}
        consumer.pending.clear()

    def _next(self) -> int | None:
        while self.redeliver:
            i = min(self.redeliver)
            self.redeliver.discard(i)
            if not self.done(i):
                return i
        entries = self.topic.entries
        while self.read_pos < len(entries):
            i = self.read_pos
            self.read_pos += 1
            if not self.done(i):
                return i
        return None

    def dispatch(self) -> None:
        """Deliver entries to consumers holding permits (round robin for Shared)."""
        progress = True
        while progress and self.consumers:
            progress = False
            for c in list(self.consumers):
                if c.permits <= 0:
                    continue
                i = self._next()
                if i is None:
                    return
                e = self.topic.entries[i]
                cmd = p.command(p.MESSAGE, consumer_id=c.consumer_id, message_id=p.message_id(self.topic.ledger, i))
                c.send(p.encode_frame(cmd, e.blob, e.crc))
                c.permits -= e.num_messages
                c.pending.add(i)
                progress = True


@dataclass(eq=False)
class Topic:
    name: str
    ledger: int = field(default_factory=lambda: next(_ledgers))
    entries: list[Entry] = field(default_factory=list)
    subscriptions: dict[str, Subscription] = field(default_factory=dict)
    last_sequence: dict[str, int] = field(default_factory=dict)  # producer name -> highest sequence id stored
    receipts: dict[tuple[str, int], int] = field(default_factory=dict)  # (producer, sequence id) -> entry

    def append(self, entry: Entry, producer: str, sequence_id: int, highest_sequence_id: int) -> int:
        self.entries.append(entry)
        index = len(self.entries) - 1
        self.last_sequence[producer] = max(highest_sequence_id, self.last_sequence.get(producer, -1))
        self.receipts[(producer, sequence_id)] = index
        if len(self.receipts) > 100_000:  # only recent receipts matter for duplicate detection
            for key in list(self.receipts)[:50_000]:
                del self.receipts[key]
        for sub in list(self.subscriptions.values()):
            sub.dispatch()
        return index

    def index_of(self, mid) -> int:
        """Entry index a MessageIdData designates (before the first / past the last when out of range)."""
        ledger = mid.ledgerId
        if ledger == p.U64_MAX or ledger < self.ledger:  # earliest, or an older ledger
            return 0
        if ledger > self.ledger or mid.entryId >= (1 << 63):  # latest
            return len(self.entries)
        return min(mid.entryId, len(self.entries))

    def index_at_time(self, publish_time_ms: int) -> int:
        for i, e in enumerate(self.entries):
            if e.publish_time >= publish_time_ms:
                return i
        return len(self.entries)

    def last_message_id(self):
        if not self.entries:
            return p.message_id(self.ledger, -1, -1, -1)
        n = self.entries[-1].num_messages
        return p.message_id(self.ledger, len(self.entries) - 1, -1, n - 1 if n > 1 else -1)
