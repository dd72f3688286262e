"""A pending collection's stream rows, kept aside while its snapshot runs beside the stream, and handed over.

A collection of a many-collection job whose snapshot has not committed yet is *pending*: a batch does not merge
its rows (its table is the snapshot's alone until then) but stages them, as they came (the source's ``payload``
pieces), to ``<staging>/<collection id>/batch-<batch id>/rows/``: Parquet written by the batch's tasks with
``overwrite`` (a batch Spark runs again after a kill replaces its own files, never adds a copy); its DropPartition
/ Truncate rows go in the small ``staged.json`` beside them, which the driver writes last: a directory without it
is an unfinished attempt, ignored at the handover and overwritten when Spark runs the batch again.

The handover (:func:`apply_staged`, the batch thread's, never beside another write of the table) applies each
staged batch in batch-id order through the table's own :class:`~msgstream_spark.spark.mirror.MirrorBatch`, with
``min_ts`` = the snapshot's S (rows at or before it are the snapshot's) and the batch's **own** id as its record:
a batch the table already recorded (a handover killed half-way) is skipped, none is applied twice.
docs/mirror.md "Snapshots while streaming".
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import signal
from dataclasses import asdict
from typing import Any

from msgstream_spark.source.multi import KIND_ROWS
from msgstream_spark.spark.mirror import FAILPOINT_ENV
from msgstream_spark.spark.mirror_many import _unpack_fn  # the stream's own unpacking of a batch's pieces
from msgstream_spark.spark.removals import Removal, Target, with_removals

log = logging.getLogger(__name__)

MARK = "staged.json"  # written last: {"rows": bool, "removals": [...]}
_BATCH = re.compile(r"^batch-(\d+)$")


def failpoint(name: str) -> None:
    """Tests: SIGKILL the driver (and its process group, when the test made it one) at failpoint ``name`` when
    ``MSGSTREAM_MIRROR_FAILPOINT`` names it (``kill-after-staging:<collection id>``: a batch staged its rows;
    ``kill-after-snapshot:<collection id>``: its snapshot committed; ``kill-in-handover:<collection id>``: the first
    of its two or more staged batches applied)."""
    if name not in {p.strip() for p in os.environ.get(FAILPOINT_ENV, "").split(",")}:
        return
    log.warning("failpoint %s: SIGKILL", name)
    if os.getpgrp() == os.getpid():
        os.killpg(os.getpgrp(), signal.SIGKILL)
    os.kill(os.getpid(), signal.SIGKILL)


def batch_dir(root: str, cid: int, batch_id: int) -> str:
    return os.path.join(root, str(cid), f"batch-{batch_id}")


def stage(df, root: str, cid: int, batch_id: int, rows: bool, removals: list[Removal]) -> None:
    """The batch ``df``'s rows of collection ``cid`` (``rows``: it has some) and its removals, staged."""
    from pyspark.sql import functions as F

    where = batch_dir(root, cid, batch_id)
    if os.path.isdir(where):  # an earlier attempt of this batch (killed before Spark committed it)
        shutil.rmtree(where)
    if rows:
        part = df.where((F.col("kind") == KIND_ROWS) & (F.col("_collection") == cid)).select("payload")
        part.write.mode("overwrite").parquet(os.path.join(where, "rows"))
    os.makedirs(where, exist_ok=True)
    tmp = os.path.join(where, f".{MARK}.tmp")
    with open(tmp, "w") as f:
        json.dump({"rows": rows, "removals": [asdict(r) for r in removals]}, f)
    os.replace(tmp, os.path.join(where, MARK))
    log.info("batch %d: collection id %d is pending its snapshot: %s staged in %s", batch_id, cid,
             "its rows" + (f" and {len(removals)} removal(s)" if removals else "") if rows else
             f"{len(removals)} removal(s)", where)
    failpoint(f"kill-after-staging:{cid}")


def staged(root: str, cid: int) -> list[int]:
    """The batch ids staged for collection ``cid`` (finished attempts only), in order."""
    where = os.path.join(root, str(cid))
    ids = [int(m.group(1)) for m in map(_BATCH.match, os.listdir(where) if os.path.isdir(where) else []) if m]
    return sorted(i for i in ids if os.path.exists(os.path.join(batch_dir(root, cid, i), MARK)))


def apply_staged(spark, m: Any, root: str, cid: int, batch_id: int) -> None:
    """Staged batch ``batch_id`` of collection ``cid`` merged into its table (``m``: its ``Mirrored``, whose
    ``min_ts`` is the snapshot's S) with that batch id as the commit's record (skipped if recorded)."""
    from pyspark.sql.pandas.types import from_arrow_schema

    where = batch_dir(root, cid, batch_id)
    with open(os.path.join(where, MARK)) as f:
        mark = json.load(f)
    schema = from_arrow_schema(m.rows_schema)
    if mark["rows"]:
        rows = spark.read.parquet(os.path.join(where, "rows"))
        rows = rows.mapInArrow(_unpack_fn(m.rows_schema, m.pk, m.min_ts), schema)
    else:
        rows = spark.createDataFrame([], schema)
    removals = [Removal(**r) for r in mark["removals"]]
    if removals:
        rows = with_removals(Target(m.table, m.pk, m.rows_schema, cid, m.min_ts), rows, removals)
    m.sink(rows, batch_id)


def clear(root: str, cid: int) -> None:
    """Collection ``cid``'s staged batches removed (every one is recorded in its table)."""
    where = os.path.join(root, str(cid))
    if os.path.isdir(where):
        shutil.rmtree(where)
