"""The mirror jobs' streaming query (both the one-collection and the database job): started into a
``foreachBatch`` function, awaited to its end or its timeout, with progress lines; the driver's long-lived objects
set aside from full garbage collections while it runs (``jobs._common.long_lived``)."""

from __future__ import annotations

import uuid

from msgstream_spark.jobs._common import long_lived, spark_error_line


def await_query(query, trig: dict, timeout: float | None) -> None:
    try:
        if "processingTime" in trig and timeout is not None:
            if not query.awaitTermination(timeout):
                query.stop()
        else:
            query.awaitTermination()
    except KeyboardInterrupt:
        query.stop()


def run_into(df, sink, checkpoint: str, trig: dict, args, name: str, started=None) -> tuple[str | None, int, int]:
    """Run the stream ``df`` into the ``foreachBatch`` function ``sink`` until it ends, with progress lines; (the
    query's error line or None, rows, batches). Both mirror jobs' query. ``started`` (else the sink's
    ``on_query_start``, if it has one): told the query once it runs (the metrics' backlog reads its progress)."""
    from msgstream_spark.jobs.ingest import Progress

    with long_lived():  # the driver's objects so far: no full garbage collection walks them in a batch
        query = (df.writeStream.foreachBatch(sink).option("checkpointLocation", checkpoint)
                 .trigger(**trig).queryName(f"{name}-{uuid.uuid4().hex[:8]}").start())
        started = started or getattr(sink, "on_query_start", None)
        if started is not None:
            started(query)
        progress = Progress(query, args.progress_interval, getattr(sink, "input_rows", None)).start()
        try:
            await_query(query, trig, args.timeout)
        finally:
            progress.stop()
    err = query.exception()
    return (None if err is None else (spark_error_line(err) or str(err))), progress.total(), progress.batches
