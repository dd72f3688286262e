"""Maintenance of a mirror table: compact its files, list orphaned files, vacuum.

``msgstream mirror compact --table lake/products`` rewrites the files
with deleted rows and the small ones (one commit, exactly once); ``orphans`` lists files no current
version references, split into expired history (an earlier version read them: superseded deletion vectors,
files a compaction removed) and what writers killed or failed before their commit left (``left_by_writers``);
``vacuum --retain-hours H`` deletes
the files no version committed within H hours reads (a file removed at time T stays until T is H hours
old; a file nothing references, once written H hours ago; Iceberg: the older snapshots expired first, and
its metadata files with them). Each holds the table's writer lock: it is refused while a
mirror job runs on the table (the job maintains its table itself: ``--maintenance KEY=VALUE``, docs/mirror.md
"Maintenance policy"). See docs/mirror.md.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence
from typing import Any

from msgstream_spark.cli.job_commands import MIRROR_JOBS
from msgstream_spark.cli.table_args import add_table_args, resolve_table_format, table_options
from msgstream_spark.jobs._common import main_wrapper

ACTIONS = ("compact", "orphans", "vacuum")
log = logging.getLogger("msgstream_spark.jobs")


def build_parser(action: str | None = None) -> argparse.ArgumentParser:
    """The parser of one action (``msgstream mirror <action>``: the action is the command's name, not an
    argument, and only its own flags are shown), or without ``action`` the module's (``python -m ...
    mirror_maintain ACTION ...``), whose first argument names it."""
    if action is None:
        p = argparse.ArgumentParser(prog="mirror_maintain", description=__doc__.split("\n\n")[0])
        p.add_argument("action", choices=ACTIONS, help="then that action's arguments (mirror_maintain ACTION --help)")
        return p
    p = argparse.ArgumentParser(prog=f"mirror_maintain {action}", description=MIRROR_JOBS[action][1])
    p.set_defaults(action=action)
    add_table_args(p, checkpoint=False)
    if action == "compact":
        p.add_argument("--target-mb", type=int, default=256, help="size of the files written (default 256)")
    if action == "vacuum":
        p.add_argument("--retain-hours", type=float, default=168.0,
                       help="keep every file a version committed within this many hours reads, and "
                            "unreferenced files written within it (default 168)")
        p.add_argument("--dry-run", action="store_true", help="list, delete and expire nothing")
    return p


def run(args: argparse.Namespace) -> dict[str, Any]:
    from msgstream_spark.mirror.maintenance import ORPHAN_KINDS, classify_orphans, compact, orphans, vacuum
    from msgstream_spark.mirror.table import open_existing

    resolve_table_format(args)
    table = open_existing(args.table_format, args.table, **table_options(args))
    out: dict[str, Any] = {"job": f"mirror {args.action}", "table": args.table, "format": args.table_format}
    if args.action == "compact":
        done = compact(table, args.target_mb << 20)
        out.update(files_in=done.files_in, files_out=done.files_out, rows=done.rows, deleted_rows=done.deleted_rows)
    elif args.action == "orphans":
        found = orphans(table)
        kinds = classify_orphans(table, found)
        out.update(orphans=found, expired_history=kinds.expired_history, left_by_writers=kinds.left_by_writers,
                   kinds=ORPHAN_KINDS)
        log.info("%d orphaned file(s): %d of expired history (%s); %d left by writers (%s)", len(found),
                 len(kinds.expired_history), ORPHAN_KINDS["expired_history"], len(kinds.left_by_writers),
                 ORPHAN_KINDS["left_by_writers"])
    else:
        out["removed" if not args.dry_run else "would_remove"] = vacuum(table, args.retain_hours * 3600,
                                                                        dry_run=args.dry_run)
    return out


def main(argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """``argv``: the action, then its arguments; ``prog``: the command's name (``msgstream mirror orphans``)."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ACTIONS:
        build_parser().parse_args(argv[:1])  # usage, or the error naming the actions (exits)
    action = argv[0]
    return main_wrapper(build_parser(action), run, argv[1:], prog or f"mirror_maintain {action}")


if __name__ == "__main__":
    sys.exit(main())
