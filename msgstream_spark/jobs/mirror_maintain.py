"""Maintenance of a mirror table: compact its files, list orphaned files, vacuum.

``msgstream mirror compact --table lake/products`` rewrites the files
with deleted rows and the small ones (one commit, exactly once); ``orphans`` lists files no current
version references (a batch or compaction killed before its commit); ``vacuum --retain-hours H`` deletes
the files no version committed within H hours reads (a file removed at time T stays until T is H hours
old; a file nothing references, once written H hours ago; Iceberg: the older snapshots expired first, and
its metadata files with them). Each holds the table's writer lock: it is refused while a
mirror job runs on the table (use ``msgstream mirror run --compact-every N`` there). See docs/mirror.md.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from msgstream_spark.cli.table_args import add_table_args, resolve_table_format, table_options
from msgstream_spark.jobs._common import main_wrapper


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="mirror_maintain", description=__doc__.split("\n\n")[0])
    p.add_argument("action", choices=["compact", "orphans", "vacuum"])
    add_table_args(p, checkpoint=False)
    p.add_argument("--target-mb", type=int, default=256, help="compact: size of the files written (default 256)")
    p.add_argument("--retain-hours", type=float, default=168.0,
                   help="vacuum: keep every file a version committed within this many hours reads, and "
                        "unreferenced files written within it (default 168)")
    p.add_argument("--dry-run", action="store_true", help="vacuum: list, delete and expire nothing")
    return p


def run(args: argparse.Namespace) -> dict[str, Any]:
    from msgstream_spark.mirror.maintenance import compact, orphans, vacuum
    from msgstream_spark.mirror.table import open_existing

    resolve_table_format(args)
    table = open_existing(args.table_format, args.table, **table_options(args))
    out: dict[str, Any] = {"job": f"mirror {args.action}", "table": args.table, "format": args.table_format}
    if args.action == "compact":
        done = compact(table, args.target_mb << 20)
        out.update(files_in=done.files_in, files_out=done.files_out, rows=done.rows, deleted_rows=done.deleted_rows)
    elif args.action == "orphans":
        out["orphans"] = orphans(table)
    else:
        out["removed" if not args.dry_run else "would_remove"] = vacuum(table, args.retain_hours * 3600,
                                                                        dry_run=args.dry_run)
    return out


def main(argv=None, prog: str | None = None) -> int:
    return main_wrapper(build_parser(), run, argv, prog)


if __name__ == "__main__":
    sys.exit(main())
