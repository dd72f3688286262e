"""Replay: a bounded batch read of channels from a position or timestamp range into a table.

``msgstream replay --channels ch0,ch1 --from <positions> --table lake/replay`` reads
with ``spark.read.format("msgstream")`` from the start positions (a saved checkpoint, a
Milvus channel checkpoint, ``earliest``) or a start timestamp, to the end positions,
an end timestamp or ``latest``, and writes the rows to a table.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

from msgstream_spark.cli.vocab import add_channels_arg, add_flag, at_file
from msgstream_spark.jobs._common import add_config_args, main_wrapper, source_options, spark_session


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="replay", description=__doc__.split("\n\n")[0])
    add_config_args(p)
    add_channels_arg(p, meaning="comma-separated channels (pchannels) to read")
    add_flag(p, ("--table",), old=("--output",), dest="output", required=True, metavar="LOCATION",
             help="the table's location (a directory)")
    add_flag(p, ("--table-format",), old=("--format",), dest="format", default="parquet",
             help="Spark file format of the table (default parquet)")
    p.add_argument("--mode", default="append", choices=["append", "overwrite", "error", "ignore"],
                   help="save mode of the table (default append)")
    start = p.add_mutually_exclusive_group()
    start.add_argument("--from", dest="start", default=None, metavar="POSITIONS",
                       help="start positions: earliest (default), JSON/base64 MsgPosition(s), or @file "
                            "holding them")
    add_flag(start, ("--from-timestamp",), old=("--from-ts",), dest="from_ts", metavar="TS",
             help="start timestamp (hybrid ts or ISO-8601)")
    end = p.add_mutually_exclusive_group()
    end.add_argument("--to", dest="end", default=None, metavar="POSITIONS",
                     help="end positions (default latest), JSON/base64 or @file")
    add_flag(end, ("--to-timestamp",), old=("--to-ts",), dest="to_ts", metavar="TS",
             help="end timestamp (hybrid ts or ISO-8601)")
    p.add_argument("--dedupe", action="store_true", help="drop replayed sink batches")
    return p


def run(args: argparse.Namespace, spark=None) -> dict[str, Any]:
    starting = at_file(args.start)
    ending = at_file(args.end)
    spark = spark or spark_session("msgstream-replay", args.master)
    opts = source_options(args, channels=args.channels, startingPositions=starting, endingPositions=ending,
                          startingTimestamp=args.from_ts, endingTimestamp=args.to_ts,
                          dedupe="true" if args.dedupe else None)
    t0 = time.perf_counter()
    df = spark.read.format("msgstream").options(**opts).load()
    df = df.cache()
    counts = ({r["op"]: int(r["count"]) for r in df.groupBy("op").count().collect()}
              if "op" in df.columns else {})
    total = int(sum(counts.values())) if counts else df.count()
    df.write.format(args.format).mode(args.mode).save(args.output)
    df.unpersist()
    secs = time.perf_counter() - t0
    return {"job": "replay", "output": args.output, "rows": total, "rows_per_op": counts,
            "seconds": round(secs, 3), "rows_per_second": round(total / secs, 1) if secs > 0 else None}


def main(argv=None, prog: str | None = None) -> int:
    return main_wrapper(build_parser(), run, argv, prog)


if __name__ == "__main__":
    raise SystemExit(main())
