"""Ingest: stream channels into a table (a change log of inserts and deletes).

``msgstream ingest --channels ch0,ch1 --table lake/events`` reads the channels with
the ``msgstream`` streaming source and appends every row (``op``, the primary key, the
fields, ``_channel``, ``_ts``, ``_position``) to a Parquet table (any Spark file format
with ``--table-format``), with a checkpoint so a rerun continues where the last one stopped.
"""

from __future__ import annotations

import argparse
import base64
import json
import logging
import threading
import time
from typing import Any

from msgstream_spark.cli.vocab import add_channels_arg, add_flag, at_file
from msgstream_spark.errors import MsgStreamError
from msgstream_spark.jobs._common import (
    add_config_args,
    main_wrapper,
    source_options,
    spark_error_line,
    spark_session,
    trigger_kwargs,
)

log = logging.getLogger("msgstream_spark.jobs.ingest")


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="ingest", description=__doc__.split("\n\n")[0])
    add_config_args(p)
    add_channels_arg(p, meaning="comma-separated channels (pchannels) to read")
    add_flag(p, ("--table",), old=("--output",), dest="output", required=True, metavar="LOCATION",
             help="the table's location (a directory)")
    add_flag(p, ("--table-format",), old=("--format",), dest="format", default="parquet",
             help="Spark file format of the table (default parquet)")
    p.add_argument("--checkpoint", help="checkpoint directory (default: <table>_checkpoint)")
    p.add_argument("--subscription", default="msgstream-ingest", help="subscription name (default msgstream-ingest)")
    add_flag(p, ("--from",), old=("--starting",), dest="starting", default="earliest", metavar="POSITIONS",
             help="where a new query starts: earliest (default), latest, or positions (JSON/base64, or @file "
                  "holding them)")
    p.add_argument("--trigger", default="available-now",
                   help="available-now (default: read what is there, then stop), once, or "
                        "processing-time:<interval> (e.g. processing-time:10s; runs until --timeout or Ctrl-C)")
    p.add_argument("--max-rows-per-trigger", type=int, help="admission control: rows per micro-batch")
    p.add_argument("--dedupe", action="store_true", help="drop replayed sink batches (exactly-once reading)")
    p.add_argument("--partition-by", help="comma-separated table partition columns (e.g. _channel)")
    p.add_argument("--timeout", type=float, help="stop a processing-time query after this many seconds")
    p.add_argument("--progress-interval", type=float, default=5.0, help="seconds between progress lines")
    return p


def _offset_lag(latest: Any, end: Any) -> dict[str, dict[str, int]]:
    """Per channel lag between the newest offset and the processed one (messages where known, ms)."""
    def load(o):
        if isinstance(o, str):
            try:
                o = json.loads(o)
            except ValueError:
                return {}
        return o if isinstance(o, dict) else {}  # Spark reports "null" before a source's first batch

    latest, end = load(latest), load(end)
    out: dict[str, dict[str, int]] = {}
    for ch, lo in latest.items():
        eo = end.get(ch, {}) if isinstance(end, dict) else {}
        if not isinstance(lo, dict) or not isinstance(eo, dict):
            continue
        lag: dict[str, int] = {}
        try:
            lag["ms"] = max(0, (int(lo.get("ts", 0)) >> 18) - (int(eo.get("ts", 0)) >> 18)) if eo.get("ts") else 0
        except (TypeError, ValueError):
            pass
        try:
            a = base64.b64decode(lo.get("msgID", "")), base64.b64decode(eo.get("msgID", ""))
            if len(a[0]) == 8 and len(a[1]) == 8:
                lag["messages"] = max(0, int.from_bytes(a[0], "little") - int.from_bytes(a[1], "little"))
        except (TypeError, ValueError):
            pass
        out[ch] = lag
    return out


class Progress:
    """Prints rows and lag of a running query every ``interval`` seconds (a daemon thread)."""

    def __init__(self, query, interval: float, more=None) -> None:
        self.query = query
        self.interval = interval
        self.more = more  # the rows a batch's own tasks read, which Spark's progress does not count (or None)
        self.rows = 0
        self.batches = 0
        self._seen: set[tuple[int, str]] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="ingest-progress", daemon=True)

    def start(self) -> Progress:
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.interval):
            self.report()

    def collect(self) -> None:
        for p in self.query.recentProgress or []:
            # One report per trigger: a trigger that found no data reports the id of the batch still to come, and
            # that batch reports the same id when it runs, so the id alone would drop the batch's rows.
            key = ((int(p.get("batchId", -1)), str(p.get("timestamp"))) if isinstance(p, dict)
                   else (int(p.batchId), str(p.timestamp)))
            if key in self._seen:
                continue
            self._seen.add(key)
            d = p if isinstance(p, dict) else json.loads(p.json)
            n = int(d.get("numInputRows", 0))
            if n or d.get("sources"):
                self.rows += n
                self.batches += 1

    def report(self) -> None:
        self.collect()
        last = self.query.lastProgress
        lag = {}
        if last:
            d = last if isinstance(last, dict) else json.loads(last.json)
            for s in d.get("sources", []):
                lag.update(_offset_lag(s.get("latestOffset"), s.get("endOffset")))
        log.info("progress: %d rows in %d batch(es); lag %s", self.total(), self.batches,
                 json.dumps(lag, sort_keys=True) if lag else "unknown")

    def total(self) -> int:
        """The rows read: Spark's input rows and those the batches' own tasks read."""
        return self.rows + (self.more() if self.more is not None else 0)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=self.interval + 5)
        self.collect()


def run(args: argparse.Namespace, spark=None) -> dict[str, Any]:
    trig = trigger_kwargs(args.trigger)
    spark = spark or spark_session("msgstream-ingest", args.master)
    opts = source_options(args, channels=args.channels, subscription=args.subscription,
                          startingPositions=at_file(args.starting), maxRowsPerTrigger=args.max_rows_per_trigger,
                          dedupe="true" if args.dedupe else None)
    checkpoint = args.checkpoint or args.output.rstrip("/") + "_checkpoint"
    df = spark.readStream.format("msgstream").options(**opts).load()
    w = (df.writeStream.format(args.format).option("path", args.output)
         .option("checkpointLocation", checkpoint).outputMode("append").trigger(**trig))
    if args.partition_by:
        w = w.partitionBy(*[c.strip() for c in args.partition_by.split(",") if c.strip()])
    t0 = time.perf_counter()
    query = w.start()
    progress = Progress(query, args.progress_interval).start()
    try:
        if "processingTime" in trig and args.timeout is not None:
            finished = query.awaitTermination(args.timeout)
            if not finished:
                query.stop()
        else:
            query.awaitTermination()
    except KeyboardInterrupt:
        query.stop()
    finally:
        progress.stop()
    err = query.exception()
    if err is not None:
        raise MsgStreamError(f"ingest query failed: {spark_error_line(err) or err}")
    secs = time.perf_counter() - t0
    progress.report()
    return {"job": "ingest", "output": args.output, "format": args.format, "checkpoint": checkpoint,
            "rows": progress.rows, "batches": progress.batches, "seconds": round(secs, 3),
            "rows_per_second": round(progress.rows / secs, 1) if secs > 0 else None}


def main(argv=None, prog: str | None = None) -> int:
    return main_wrapper(build_parser(), run, argv, prog)


if __name__ == "__main__":
    raise SystemExit(main())
