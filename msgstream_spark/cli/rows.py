"""``msgstream rows``: the rows of ``spark.read.format("msgstream")`` as JSON lines, without Spark.

Goes through :func:`msgstream_spark.source.read_arrow` (same options, same rows): binary columns
print as base64, timestamps as ISO-8601.
"""

from __future__ import annotations

import argparse
import datetime as dt
import decimal
from typing import Any

from msgstream_spark.cli.common import UsageError, load_config, split_channels
from msgstream_spark.cli.render import dumps
from msgstream_spark.cli.vocab import add_channels_arg, at_file, data_options
from msgstream_spark.source import read_arrow


def add_rows_parser(sub: Any, common: Any) -> None:
    p = sub.add_parser("rows", help="the source's rows (or messages) of a bounded read, as JSON lines")
    common(p, "read")
    add_channels_arg(p)
    p.add_argument("--from", dest="start", metavar="POSITIONS",
                   help="startingPositions: earliest (default), latest, or positions (JSON per channel or base64 "
                        "MsgPosition list, or @file holding them)")
    p.add_argument("--to", dest="end", metavar="POSITIONS", help="endingPositions: latest (default) or positions")
    p.add_argument("--collection", help="collection name or id (option collection)")
    p.add_argument("--output", choices=("rows", "messages"), default="rows", help="rows (default) or messages")
    p.add_argument("--limit", "-n", type=int, help="stop after this many rows")


def _options(args: argparse.Namespace) -> dict[str, str]:
    """The read options: ``--output``, ``--collection`` and the undotted keys of ``--option`` (its config keys
    go to the config)."""
    out = {"output": args.output}
    if args.collection:
        out["collection"] = args.collection
    out.update(data_options(args))
    return out


def _plain(v: Any) -> Any:
    if isinstance(v, dt.datetime):
        return v.isoformat()
    if isinstance(v, decimal.Decimal):  # _seq, decimal(38,0): an exact JSON integer
        return int(v)
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


def cmd_rows(args: argparse.Namespace) -> int:
    if args.limit is not None and args.limit <= 0:
        raise UsageError("--limit must be > 0")
    printed = 0
    for batch in read_arrow(load_config(args), split_channels(args.channels), at_file(args.start), at_file(args.end),
                            **_options(args)):
        for row in batch.to_pylist():
            print(dumps({k: _plain(v) for k, v in row.items()}), flush=False)
            printed += 1
            if args.limit is not None and printed >= args.limit:
                return 0
    return 0
