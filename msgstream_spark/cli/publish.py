"""``msgstream publish``: a file's rows (or a synthetic collection) as insert/delete events.

Same encoding as the Spark sink (one :class:`TaskWriter`), without Spark.
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from msgstream_spark.cli.common import UsageError, progress_line, split_channels, write_progress
from msgstream_spark.cli.data import delete_batch, read_table, synthetic_batches, synthetic_schema
from msgstream_spark.cli.publish_args import wire_options
from msgstream_spark.cli.vocab import parse_kv
from msgstream_spark.sink.options import parse_sink_options
from msgstream_spark.sink.plan import plan_write
from msgstream_spark.sink.task import TaskWriter


def sink_options_from_args(args) -> dict[str, str]:
    """The sink options (same names as the Spark sink) for the CLI arguments."""
    opts: dict[str, str] = {"channels": ",".join(split_channels(args.channels)),
                            "collection": args.collection, "partition": args.partition}
    if args.max_message_size is not None:
        opts["maxMessageSize"] = str(args.max_message_size)
    if args.config:
        opts["config"] = args.config
    if args.collection_id:
        opts["collectionID"] = str(args.collection_id)
    if args.primary_key:
        opts["primaryKey"] = args.primary_key
    if args.field_types:
        opts["fieldTypes"] = args.field_types
    opts.update(wire_options(args))
    opts.update(parse_kv(args.option))  # config keys and sink options, as the Spark sink takes them
    return opts


def delete_keys(pks: np.ndarray, fraction: float) -> np.ndarray:
    """A deterministic, evenly spread ``fraction`` of ``pks`` (every k-th key)."""
    if fraction <= 0 or len(pks) == 0:
        return pks[:0]
    step = max(1, int(round(1.0 / fraction)))
    return pks[::step]


def publish(args) -> dict[str, Any]:
    if not 0.0 <= args.delete_fraction <= 1.0:
        raise UsageError("--delete-fraction must be between 0 and 1")
    if args.batch_rows <= 0:
        raise UsageError("--batch-rows must be > 0")
    opts = parse_sink_options(sink_options_from_args(args))
    if args.synthetic is not None:
        if args.synthetic < 0 or args.dim <= 0:
            raise UsageError("--synthetic needs ROWS >= 0 and --dim > 0")
        schema = synthetic_schema(args.dim)
        total = args.synthetic
        batches = synthetic_batches(args.synthetic, args.dim, args.batch_rows, start=args.start)
    else:
        table = read_table(args.input, args.format)
        schema = table.schema
        total = table.num_rows
        batches = iter(table.to_batches(max_chunksize=args.batch_rows))
    plan = plan_write(schema, opts)
    writer = TaskWriter(opts, plan)
    t0 = time.perf_counter()
    done = 0
    pk_parts: list[np.ndarray] = []
    show = not args.no_progress
    try:
        for b in batches:
            writer.add(b)
            done += b.num_rows
            if args.delete_fraction > 0:
                pk_parts.append(delete_keys(b.column(plan.pk).to_numpy(zero_copy_only=False),
                                            args.delete_fraction))
            if show:
                write_progress(progress_line(done, total, t0))
        deleted = 0
        if pk_parts:
            keys = np.concatenate(pk_parts)
            if len(keys):
                writer.add(delete_batch(keys, plan.pk))
                deleted = len(keys)
        writer.finish()
    finally:
        writer.close()
    secs = time.perf_counter() - t0
    if show:
        write_progress(progress_line(done, total, t0), final=True)
    r = writer.result
    return {"inserted": sum(s.inserted for s in r.channels.values()),
            "deleted": sum(s.deleted for s in r.channels.values()),
            "requested_deletes": deleted, "seconds": round(secs, 3),
            "rows_per_second": round(done / secs, 1) if secs > 0 else None,
            "channels": {ch: {"messages": s.messages, "inserted": s.inserted, "deleted": s.deleted,
                              "last_msgID": s.last_id, "time_tick": s.time_tick,
                              **({"txn_id": s.txn_id, "txn": s.txn} if s.txn_id else {})}
                         for ch, s in sorted(r.channels.items())}}
