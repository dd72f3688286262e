"""The plan of a read and the read of one range, Spark-free.

A range is one id range of one channel: after ``start`` (or at it, with Milvus's
seek filter when ``inclusive``) up to ``end`` inclusive, or up to a position (``exclusive``: what a
resume from it would not read). ``read_range``
is stateless: everything it needs is inside the (picklable) range and the Arrow schema.
Spark's partitions are these ranges (``msgstream_spark.spark.partitions``).
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa

from msgstream_spark.errors import ConsumeError, DataLossError
from msgstream_spark.sink.dedupe import ReplayFilter
from msgstream_spark.source.apply import RowsHandler, handle_message
from msgstream_spark.source.multi import CollectionsBuilder
from msgstream_spark.source.offsets import Entry, Offset, unb64
from msgstream_spark.source.options import ReadOptions
from msgstream_spark.source.ranges import MIN_TASKS, pack, piece_size, plan_ranges
from msgstream_spark.source.rows import MessagesBuilder, RowsBuilder
from msgstream_spark.source.upserts import Pairer
from msgstream_spark.stream.seek import AFTER, BEFORE, DONE, EndFilter, SeekFilter
from msgstream_spark.stream.timeseek import tick_and_time

log = logging.getLogger(__name__)

# Messages fetched per call: inserts run to ~0.5 MB (1000 rows of 128-d vectors), so a fetch
# stays in the tens of MB while small messages still come in large enough groups.
FETCH_MESSAGES = 128


@dataclass
class ReadRange:
    """Plain data: the range of one channel and what is needed to read and convert it."""

    channel: str
    start: Entry
    end: Entry
    opts: ReadOptions
    schema_json: str
    pk_name: str | None = None
    collection_id: int | None = None
    collection_name: str | None = None
    limit: Entry | None = None  # an earlier piece of a split range: the range's end (transactions finish)


def list_channels(opts: ReadOptions, client: Any) -> list[str]:
    """The channels a read covers: option channels, else the backend's channels matching channelPattern."""
    if opts.channels:
        return list(opts.channels)
    rx = re.compile(opts.channel_pattern or "")
    return sorted(c for c in client.list_channels() if rx.fullmatch(c))


def collection_filter(opts: ReadOptions) -> tuple[int | None, str | None]:
    """(collection id, collection name) of option ``collection`` (a number is an id)."""
    if opts.collection is None:
        return None, None
    return (int(opts.collection), None) if opts.collection.isdigit() else (None, opts.collection)


def plan_reads(client: Any, start: Offset, end: Offset, opts: ReadOptions, schema_json: str,
               pk_name: str | None, collection: tuple[int | None, str | None] = (None, None),
               ) -> list[ReadRange]:
    """One range per channel with data in (start, end], cut by ``minPartitions`` and
    ``maxRecordsPerPartition`` where the backend's ids are integer offsets, at safe messages
    (:mod:`msgstream_spark.source.ranges` says where and why).

    A piece that ends inside a 2.6 transaction reads on (up to its channel's end) until that
    transaction ends, and keeps only its rows; the next piece ignores them (it never saw the Begin).
    """
    cid, cname = collection
    pieces = plan_ranges(client, start, end, opts.min_partitions, opts.max_records, dedupe=opts.dedupe)
    last = {ch: e for ch, _s, e in pieces}  # pieces come in order: the last one ends the channel's range
    return [ReadRange(ch, s, e, opts, schema_json, pk_name, cid, cname, None if e is last[ch] else last[ch])
            for ch, s, e in pieces]


def plan_tasks(client: Any, ranges: list[ReadRange], opts: ReadOptions) -> list[list[ReadRange]]:
    """The ranges grouped into read tasks: small ranges share a task (:func:`~msgstream_spark.source.ranges.pack`),
    never fewer tasks than ``minPartitions``; a task reads its ranges one after the other."""
    if opts.max_records or len(ranges) <= max(MIN_TASKS, opts.min_partitions or 0):
        return [[r] for r in ranges]  # maxRecordsPerPartition bounds a task, not only a range
    sizes = [piece_size(client, r.channel, r.start, r.end) for r in ranges]
    groups = pack(sizes, max(MIN_TASKS, opts.min_partitions or 0))
    return [[ranges[i] for i in g] for g in groups]


def plan_read_tasks(client: Any, start: Offset, end: Offset, opts: ReadOptions, schema_json: str,
                    pk_name: str | None, collection: tuple[int | None, str | None] = (None, None),
                    ) -> list[list[ReadRange]]:
    """The read tasks of ``(start, end]``: :func:`plan_reads`' ranges grouped by :func:`plan_tasks` (a Spark read's
    partitions, and a database mirror job's own reads of the same batch)."""
    return plan_tasks(client, plan_reads(client, start, end, opts, schema_json, pk_name, collection), opts)


def read_ranges(ranges: list[ReadRange], schema: pa.Schema,
                keep: frozenset[int] | None = None) -> Iterator[pa.RecordBatch]:
    """The ranges (of one config) read one after the other through one backend client (its start cost paid once);
    ``keep``: as :func:`read_range`'s."""
    client = ranges[0].opts.client()
    try:
        for r in ranges:
            yield from read_range(r, schema, client, keep)
    finally:
        client.close()


def read_range(part: ReadRange, schema: pa.Schema, client: Any = None,
               keep: frozenset[int] | None = None) -> Iterator[pa.RecordBatch]:
    """Read one range and yield RecordBatches of ``schema`` (the output's Arrow schema). ``client``: a backend
    client of the range's config that the caller keeps open (a task reading several ranges opens it once);
    without it the read opens and closes one of its own. ``keep`` (``collections`` output): the collection ids
    whose rows are decoded; the others' rows only counted (``multi.CollectionsBuilder``)."""
    opts = part.opts
    group = opts.subscription
    dedupe = ReplayFilter() if opts.dedupe else None
    own_client = client is None
    if own_client:
        client = opts.client()
    consumer = None
    try:
        consumer = client.reader(part.channel)  # records nothing on the broker
        start_id = unb64(part.start.get("msgID", ""))
        inclusive = bool(part.start.get("inclusive"))
        # a later piece of a range that starts AT a position keeps its seek filter (ranges.py)
        seek_ts = int(part.start.get("ts", 0)) if inclusive else part.start.get("seekTs")
        if opts.output == "messages":
            builder: Any = MessagesBuilder(schema, group)
            seek = SeekFilter(seek_ts)
            rows_handler = None
        else:
            builder = CollectionsBuilder(group, keep) if opts.output == "collections" else RowsBuilder(schema, group,
                                                                                                 part.pk_name)
            # the WAL whose ids the backend's are: a broker's type, or the milvus backend's milvus.wal
            wal = getattr(client, "wal_name", None)
            rows_handler = RowsHandler(part, builder, dedupe, opts.mq_type if wal is None else wal, seek_ts)
        pairer = Pairer(part.pk_name) if opts.upsert_as == "update" and rows_handler is not None else None
        _seek(client, consumer, part.channel, start_id, inclusive, opts.fail_on_data_loss)
        end = _Bound(client, part.end)
        limit = _Bound(client, part.limit) if part.limit else None
        for m in _in_range(client, consumer, part, end, limit, seek_ts):
            if rows_handler is None:
                if end.past(m.id):
                    break
                handle_message(m, part, builder, dedupe, seek)
            elif end.past(m.id) and (limit is None or limit.past(m.id) or not rows_handler.needs_more()):
                break
            else:
                rows_handler.handle(m)
            if builder.rows >= opts.batch_rows:  # hand rows to Spark as soon as a batch is full
                yield from pairer.feed(builder.flush()) if pairer else builder.flush()
            if m.id == end.id and (rows_handler is None or limit is None or not rows_handler.needs_more()):
                break
            if limit is not None and m.id == limit.id:  # the range's last message: nothing more to wait for
                break
        if pairer:
            yield from pairer.feed(builder.flush())
            yield from pairer.finish()
        else:
            yield from builder.flush()
    finally:
        if consumer is not None:
            _drop(consumer)
        if own_client:
            client.close()


class _Bound:
    """An end entry: inclusive (stop after its message) or a position (``exclusive``: see :class:`_PositionEnd`)."""

    def __init__(self, client: Any, e: Entry) -> None:
        mid = client.bytes_to_message_id(unb64(e["msgID"]))
        self.position = _PositionEnd(client, e, mid) if e.get("exclusive") else None
        self.id = mid if self.position is None else None  # a position end decides by itself (read_range)

    def past(self, mid: Any) -> bool:
        return self.id is not None and mid > self.id


class _PositionEnd:
    """An end at a position (msgID, ts) holds what a resume from it would not read (offsets.py): the messages
    before msgID, then :class:`~msgstream_spark.stream.seek.EndFilter`'s. A backend whose messages come sorted
    by time (``Client.time_ordered``) is judged by time alone. ``upTo``: the read stops there at the latest."""

    def __init__(self, client: Any, e: Entry, at: Any) -> None:
        self.at = at
        self.up_to = client.bytes_to_message_id(unb64(e["upTo"])) if e.get("upTo") else None
        ordered = bool(getattr(client, "time_ordered", False))
        self.filter = EndFilter(int(e.get("ts", 0)), ordered=ordered)
        self.reached = ordered
        self.last = False  # the message just judged was the last one to read

    def side(self, m: Any) -> str:
        if self.up_to is not None:
            if m.id > self.up_to:
                return DONE
            self.last = m.id == self.up_to
        if not self.reached:
            if m.id < self.at:
                return BEFORE
            self.reached = True
        tick, ts = tick_and_time(m.payload, m.properties)
        side = BEFORE if ts is None else self.filter.side(tick, ts)
        return DONE if side == AFTER and self.last else side


def _in_range(client: Any, consumer: Any, part: ReadRange, end: _Bound, limit: _Bound | None,
              seek_ts: int | None) -> Iterator[Any]:
    """The channel's messages (:func:`_messages`) less what lies after the range's end when it is a position;
    ends after the last message such an end can hold."""
    at = (limit or end).position
    if limit is None and _nothing_after(client, end.id if at is None else at.up_to, seek_ts):
        return
    for m in _messages(consumer, client, part):
        side = BEFORE if at is None else at.side(m)
        if side == DONE:
            return
        if side == BEFORE:
            yield m
        if at is not None and at.last:
            return


def _nothing_after(client: Any, last: Any, seek_ts: int | None) -> bool:
    """Whether a backend that sends by time (``Client.time_ordered``) has nothing for a range whose last message
    is at or below the start's seek time (a start position at or after it: the proxy may send nothing at all)."""
    tt = getattr(last, "time_tick", None)
    return bool(getattr(client, "time_ordered", False)) and bool(seek_ts) and tt is not None and tt <= int(seek_ts)


def _messages(consumer: Any, client: Any, part: ReadRange) -> Iterator[Any]:
    """The channel's messages in order, fetched in groups; fails after ``readTimeout`` without any."""
    opts = part.opts
    last_progress = time.monotonic()
    while True:
        try:
            batch = consumer.receive_batch(FETCH_MESSAGES, 1.0)
        except DataLossError as exc:
            if opts.fail_on_data_loss:
                raise
            log.warning("%s; continuing at the first retained message (failOnDataLoss=false)", exc)
            consumer.seek(client.earliest_message_id(), inclusive=True)
            continue
        if not batch:
            if time.monotonic() - last_progress > opts.read_timeout:
                raise ConsumeError(
                    f"channel {part.channel}: no message arrived for {opts.read_timeout:.0f}s although the batch "
                    f"ends at msgID {part.end['msgID']} (option readTimeout); was the channel deleted?")
            continue
        last_progress = time.monotonic()
        yield from batch


def _seek(client: Any, consumer: Any, channel: str, start_id: bytes, inclusive: bool, fail: bool) -> None:
    try:
        if start_id:
            consumer.seek(client.bytes_to_message_id(start_id), inclusive=inclusive)
        else:
            consumer.seek(client.earliest_message_id(), inclusive=True)
    except DataLossError as exc:
        if fail:
            raise DataLossError(f"{exc}; set failOnDataLoss=false to skip to the first retained message",
                                channel=channel) from exc
        log.warning("%s; skipping to the first retained message (failOnDataLoss=false)", exc)
        consumer.seek(client.earliest_message_id(), inclusive=True)


def _drop(consumer: Any) -> None:
    """Remove a read task's throwaway subscription (best effort: the rows are already out)."""
    try:
        consumer.unsubscribe()
    except Exception:  # noqa: BLE001 - a throw-away reader; nothing to lose
        log.warning("removing the read subscription %s failed", consumer.subscription, exc_info=True)
