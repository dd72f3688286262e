"""``msgstream mirror verify`` and ``msgstream mirror status``: Spark-free checks of a mirrored table.

``verify`` prints its report as JSON lines (one per differing key, then ``{"summary": ...}``) and exits 0
when the table equals the collection, 3 when it does not (1 on an error, 2 on bad usage).
"""

from __future__ import annotations

import json
import sys
import time
import uuid
from typing import Any

from msgstream_spark.cli.common import UsageError, load_config
from msgstream_spark.cli.mirror_root_status import root_status
from msgstream_spark.cli.table_args import add_table_args, checkpoint_of, resolve_table_format, table_options
from msgstream_spark.cli.vocab import add_flag
from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.snapshot.handover import milvus_target
from msgstream_spark.mirror.table import open_table
from msgstream_spark.mirror.upkeep import maintenance_status
from msgstream_spark.mirror.verify.compare import DEFAULT_BUCKETS
from msgstream_spark.mirror.verify.milvus_side import SdkMilvusSide
from msgstream_spark.mirror.verify.pinned import PinnedTable, table_identity
from msgstream_spark.mirror.verify.run import Log, repair, run_verify, write_report
from msgstream_spark.mirror.verify.status import table_status
from msgstream_spark.mirror.watermark import checkpoint_query_id, table_watermark
from msgstream_spark.stream.factory import Factory

EXIT_DIFFERENT = 3


def add_mirror_commands(mirror_sub: Any, common: Any) -> None:
    """``verify`` and ``status`` under ``msgstream mirror``."""
    p = mirror_sub.add_parser("verify", help="compare a mirrored table with its collection (exit 0: equal, 3: not)")
    common(p)
    p.add_argument("--collection", required=True, help="collection name (read through config key milvus.address)")
    add_table_args(p)
    add_flag(p, ("--num-buckets",), old=("--buckets",), type=int, default=DEFAULT_BUCKETS, metavar="N",
             help=f"buckets of the key's hash per partition (default {DEFAULT_BUCKETS})")
    p.add_argument("--wait", type=float, default=0.0,
                   help="seconds to wait for a running job to commit past the collection's current time "
                        "before the table is read (default 0: the table as it is)")
    p.add_argument("--report-table", metavar="LOCATION",
                   help="also append the report's keys to a Delta table here (a path or URI; --storage-option applies)")
    p.add_argument("--repair", action="store_true",
                   help="re-read the differing keys from Milvus and write them through the mirror's exactly-once "
                        "merge, then verify again (stop the mirror job first: one writer per table)")
    p = mirror_sub.add_parser("status", help="per channel: how fresh the table is, the backlog, stalled; the "
                                          "table version and its maintenance state (JSON)")
    common(p)
    add_table_args(p, table_required=False)
    p.add_argument("--table-root", metavar="LOCATION",
                   help="instead of --table: every table a --database / --collections / --include job keeps under "
                        "this root (its collection list in --checkpoint, default <root>_checkpoint), each with its "
                        "database, version, last batch, freshness and dropped mark")
    p.add_argument("--collection", help="collection name (default: the table's msgstream.collection)")
    p.add_argument("--stalled-after", type=float, default=60.0,
                   help="stalled: the log holds data the table lacks and its last commit is older than this many "
                        "seconds (default 60)")


def _print(obj: dict) -> None:
    print(json.dumps(obj, default=str, sort_keys=False))


def cmd_mirror_verify(args) -> int:
    if args.num_buckets < 1:
        raise UsageError("--num-buckets must be >= 1")
    cfg = load_config(args)
    resolve_table_format(args)  # before Milvus is asked anything
    milvus = SdkMilvusSide(cfg, milvus_target(cfg, args.collection, purpose="verify"))
    table = open_table(args.table_format, args.table, collection=args.collection, pk=milvus.pk, create=False,
                       **table_options(args))
    log_ = Log(cfg, args.collection)
    result = run_verify(table, milvus, log_, checkpoint=checkpoint_of(args), buckets=args.num_buckets, wait=args.wait)
    for line in result.lines():
        _print(line)
    if args.report_table:
        write_report(result, args.report_table, uuid.uuid4().hex, table_options(args)["storage_options"])
    if args.repair and not result.equal:
        wm = result.summary.get("watermark")
        channels = sorted(_channels(table, checkpoint_of(args))) if wm else []
        fixed = repair(table, milvus, log_, result, channels)
        again = run_verify(table, milvus, log_, checkpoint=checkpoint_of(args), buckets=args.num_buckets)
        for line in again.lines():
            _print({"after_repair": line} if "summary" not in line else {"summary_after_repair": {
                **line["summary"], "repaired": fixed}})
        result = again
    sys.stdout.flush()
    return 0 if result.equal else EXIT_DIFFERENT


def _channels(table, checkpoint: str) -> list[str]:
    pinned = PinnedTable(table)
    qid = checkpoint_query_id(checkpoint)
    wm = table_watermark(table.properties(), pinned.recorded_watermark, pinned.last_batch(qid) if qid else None,
                         qid, checkpoint)
    return sorted(wm.offset) if wm is not None else []


def _open_existing(args, collection: str | None):
    """The table, its collection and key read from its own properties."""
    resolve_table_format(args)
    name, pk = table_identity(args.table_format, args.table, **table_options(args))
    if collection is not None and collection != name:
        raise MirrorError(f"table {args.table} mirrors collection {name!r}, not {collection!r}")
    return open_table(args.table_format, args.table, collection=name, pk=pk, create=False, **table_options(args))


def cmd_mirror_status(args) -> int:
    if bool(args.table) == bool(args.table_root):
        raise UsageError("mirror status: pass --table LOCATION (one table) or --table-root LOCATION (every table of "
                         "a many-collection job), one of them")
    cfg = load_config(args)
    if args.table_root:
        with Factory(cfg).client() as client:
            doc, ok = root_status(args, client)
        _print(doc)
        return 0 if ok else 1
    table = _open_existing(args, args.collection)
    pinned = PinnedTable(table)
    checkpoint = checkpoint_of(args)
    qid = checkpoint_query_id(checkpoint)
    q = pinned.committed_by[0]
    wm = table_watermark(table.properties(), pinned.recorded_watermark if q == qid else None,
                         pinned.last_batch(qid) if qid else None, qid, checkpoint)
    with Factory(cfg).client() as client:
        doc = table_status(pinned, wm, client, int(time.time() * 1000), args.stalled_after)
    doc["maintenance"] = maintenance_status(table)
    _print(doc)
    return 0


MIRROR_COMMANDS = {"verify": cmd_mirror_verify, "status": cmd_mirror_status}


def cmd_mirror(args) -> int:
    return MIRROR_COMMANDS[args.mirror_command](args)
