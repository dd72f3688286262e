"""Partitions of the msgstream source and the executor-side read of one partition.

A partition is one id range of one channel: after ``start`` (or at it, with Milvus's
seek filter when ``inclusive``) up to ``end`` inclusive (or exclusive). ``read_partition``
is stateless: everything it needs is inside the pickled partition.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
from pyspark.sql.datasource import InputPartition

from msgstream_spark.errors import ConsumeError, DataLossError, DecodeError, UnknownMessageTypeError
from msgstream_spark.msg import codec
from msgstream_spark.msg.types import MsgType
from msgstream_spark.sink.dedupe import ReplayFilter
from msgstream_spark.spark.offsets import Entry, Offset, unb64
from msgstream_spark.spark.options import ReadOptions
from msgstream_spark.spark.ranges import plan_ranges
from msgstream_spark.spark.rows import MessagesBuilder, RowsBuilder, wanted_type
from msgstream_spark.spark.scan import peek_counts
from msgstream_spark.stream.seek import SeekFilter

log = logging.getLogger(__name__)

# Messages fetched per call: inserts run to ~0.5 MB (1000 rows of 128-d vectors), so a fetch
# stays in the tens of MB while small messages still come in large enough groups.
FETCH_MESSAGES = 128


@dataclass
class ChannelPartition(InputPartition):
    """Plain data: the range of one channel and what is needed to read and convert it."""

    channel: str
    start: Entry
    end: Entry
    opts: ReadOptions
    schema_json: str
    pk_name: str | None = None
    collection_id: int | None = None
    collection_name: str | None = None

    def __post_init__(self) -> None:
        InputPartition.__init__(self, self.channel)


def plan_partitions(client: Any, start: Offset, end: Offset, opts: ReadOptions, schema_json: str,
                    pk_name: str | None, collection: tuple[int | None, str | None] = (None, None),
                    ) -> list[ChannelPartition]:
    """One partition per channel with data in (start, end], split by ``minPartitions`` where the
    backend's ids are integer offsets (:func:`msgstream_spark.spark.ranges.plan_ranges`)."""
    cid, cname = collection
    return [ChannelPartition(ch, s.to_json(), e.to_json(), opts, schema_json, pk_name, cid, cname)
            for ch, s, e in plan_ranges(client, start, end, opts.min_partitions)]


def _spark_arrow_schema(schema_json: str) -> pa.Schema:
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    return to_arrow_schema(StructType.fromJson(__import__("json").loads(schema_json)), timezone="UTC")


def _collection_matches(msg: Any, part: ChannelPartition) -> bool:
    if part.collection_id is None and part.collection_name is None:
        return True
    if msg.msg_type not in (MsgType.Insert, MsgType.Delete):
        return True
    if part.collection_id is not None and msg.collection_id == part.collection_id:
        return True
    return part.collection_name is not None and msg.proto.collection_name == part.collection_name


def read_partition(part: ChannelPartition) -> Iterator[pa.RecordBatch]:
    """Read one partition and yield RecordBatches of the exact Spark Arrow schema."""
    opts = part.opts
    schema = _spark_arrow_schema(part.schema_json)
    group = opts.subscription
    builder: Any = (MessagesBuilder(schema, group) if opts.output == "messages"
                    else RowsBuilder(schema, group, part.pk_name))
    dedupe = None
    if opts.dedupe:
        dedupe = ReplayFilter()
    client = opts.client()
    consumer = None
    try:
        consumer = client.reader(part.channel)  # records nothing on the broker
        start_id = unb64(part.start.get("msgID", ""))
        inclusive = bool(part.start.get("inclusive"))
        seek = SeekFilter(int(part.start.get("ts", 0)) if inclusive else None)
        _seek(client, consumer, part.channel, start_id, inclusive, opts.fail_on_data_loss)
        end_id = client.bytes_to_message_id(unb64(part.end["msgID"]))
        end_exclusive = bool(part.end.get("exclusive"))
        done = False
        last_progress = time.monotonic()
        while not done:
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
            for m in batch:
                if m.id > end_id or (end_exclusive and m.id >= end_id):
                    done = True
                    break
                _handle(m, part, builder, dedupe, seek)
                if builder.rows >= opts.batch_rows:  # hand rows to Spark as soon as a batch is full
                    yield from builder.flush()
                if m.id == end_id:
                    done = True
                    break
        yield from builder.flush()
    finally:
        if consumer is not None:
            _drop(consumer)
        client.close()


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


def _handle(m: Any, part: ChannelPartition, builder: Any, dedupe: Any, seek: SeekFilter) -> None:
    """Filter (Milvus's seek, types, replays, collection), decode and add one message."""
    opts = part.opts
    mid = m.id.serialize()
    try:
        t = codec.peek_msg_type(m.payload, m.properties)
    except DecodeError as exc:
        return _decode_failed(exc.with_location(part.channel, mid), opts, builder, m)
    if seek.active and t == MsgType.TimeTick:
        seek.keep(True, _header_ts(m))  # a tick never survives a seek; the first one >= ts ends it
        return
    if not wanted_type(t, opts.message_types):
        return
    if opts.output == "rows" and t not in (MsgType.Insert, MsgType.Delete):
        return
    if dedupe is not None and not dedupe.keep(part.channel, m.properties):
        return
    try:
        msg = codec.unmarshal(m.payload, m.properties, channel=part.channel, msg_id=mid)
    except UnknownMessageTypeError:
        if opts.output == "messages":  # tooling output keeps types we do not decode
            builder.add_raw(m, None)
        return
    except DecodeError as exc:
        return _decode_failed(exc, opts, builder, m)
    if (seek.active and not seek.keep(False, int(msg.begin_ts))) or not _collection_matches(msg, part):
        return
    if opts.output == "messages":
        builder.add_raw(m, msg)
    else:
        builder.add(msg, part.channel, mid)


def _header_ts(m: Any) -> int:
    return peek_counts(m.payload, MsgType.TimeTick)[1]


def _decode_failed(exc: DecodeError, opts: ReadOptions, builder: Any, m: Any) -> None:
    if opts.on_decode_error == "fail":
        raise DecodeError(f"{exc.reason} (set onDecodeError=skip to skip such messages)", channel=exc.channel,
                          msg_id=exc.msg_id, payload=exc.payload) from exc
    log.warning("skipping undecodable message (onDecodeError=skip): %s", exc)
    if opts.output == "messages":
        builder.add_raw(m, None)
