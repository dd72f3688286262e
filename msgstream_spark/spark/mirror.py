"""Mirror micro-batches of the ``msgstream`` rows into a table: the ``foreachBatch`` function.

    q = (spark.readStream.format("msgstream").option(...).load().writeStream
         .foreachBatch(MirrorBatch(table, pk="pk", checkpoint=chk)).option("checkpointLocation", chk).start())

Each micro-batch is collapsed by Spark (the newest change per primary key by ``_seq``, the change
order), brought to the driver as Arrow (its size is bounded by the source's admission control:
``maxRowsPerTrigger``) and merged by :func:`msgstream_spark.mirror.apply.apply_batch`, which commits
with the query's id and the batch id and skips a batch the table already holds. The query id is
Spark's own (``<checkpoint>/metadata``), stable across restarts from the same checkpoint.
"""

from __future__ import annotations

import json
import logging
import os
import signal
from typing import Any

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.apply import apply_batch

log = logging.getLogger(__name__)

SEQ = "_seq"
FAILPOINT_ENV = "MSGSTREAM_MIRROR_FAILPOINT"  # tests: kill-after-commit:<batch id> | kill-after-commit:first


def checkpoint_query_id(checkpoint: str) -> str:
    """Spark's query id, written by Spark to ``<checkpoint>/metadata`` when the query first starts."""
    path = os.path.join(checkpoint, "metadata")
    try:
        with open(path) as f:
            return str(json.loads(f.readline())["id"])
    except (OSError, ValueError, KeyError) as exc:
        raise MirrorError(f"cannot read the query id from {path} (the streaming checkpoint's metadata): {exc}") from exc


def collapse_in_spark(df, pk: str):
    """The newest change per primary key by the change order ``_seq``."""
    from pyspark.sql import Window
    from pyspark.sql import functions as F

    if SEQ not in df.columns:
        raise MirrorError(f"the stream's rows have no {SEQ} column (the change order); columns: {df.columns}")
    w = Window.partitionBy(pk).orderBy(F.col(SEQ).desc())
    return df.withColumn("__rank", F.row_number().over(w)).where("__rank = 1").drop("__rank")


def _failpoint(batch_id: int, committed: bool) -> None:
    """Tests: ``kill-after-commit:<batch id>``, or ``kill-after-commit:first`` (the first batch that
    committed changes), SIGKILLs the driver after the table commit and before Spark's own."""
    spec = os.environ.get(FAILPOINT_ENV, "")
    if spec == f"kill-after-commit:{batch_id}" or (committed and spec == "kill-after-commit:first"):
        log.warning("failpoint %s: SIGKILL after the table commit of batch %d", spec, batch_id)
        if os.getpgrp() == os.getpid():  # the test started the job as a group of its own: JVM too
            os.killpg(os.getpgrp(), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGKILL)


class MirrorBatch:
    """``foreachBatch`` function merging each micro-batch into ``table`` exactly once.

    ``query_id``: the identity recorded with every commit (default: Spark's query id read from
    ``checkpoint``). ``collection_id``: when set, a batch holding rows of another collection id (the
    collection was dropped and re-created under its name) fails instead of mixing the two.
    """

    def __init__(self, table, pk: str, *, query_id: str | None = None, checkpoint: str | None = None,
                 collection_id: int | None = None) -> None:
        if query_id is None and checkpoint is None:
            raise MirrorError("MirrorBatch needs query_id or checkpoint (to read Spark's query id)")
        self.table, self.pk, self.checkpoint = table, pk, checkpoint
        self._query_id = query_id
        self.collection_id = collection_id
        self.batches = 0
        self.skipped = 0
        self.rows = 0

    @property
    def query_id(self) -> str:
        if self._query_id is None:
            self._query_id = checkpoint_query_id(str(self.checkpoint))
        return self._query_id

    def __call__(self, df, batch_id: int) -> None:
        qid = self.query_id
        last = self.table.last_batch(qid)
        if last is not None and last >= batch_id:
            log.info("batch %d of query %s is already in the table (last %d): skipped", batch_id, qid, last)
            self.skipped += 1
            return
        changes = collapse_in_spark(df, self.pk).toArrow()
        self._check_collection(changes)
        committed = apply_batch(self.table, changes, self.pk, qid, batch_id)
        if committed:
            self.batches += 1
            self.rows += changes.num_rows
        else:
            self.skipped += 1
        _failpoint(batch_id, committed and changes.num_rows > 0)

    def _check_collection(self, changes: Any) -> None:
        if self.collection_id is None or "_collection" not in changes.column_names or changes.num_rows == 0:
            return
        ids = set(changes.column("_collection").drop_null().to_pylist())
        other = ids - {self.collection_id}
        if other:
            raise MirrorError(
                f"the stream holds rows of collection id(s) {sorted(other)}, but the table mirrors collection id "
                f"{self.collection_id} of that name: the collection was dropped and re-created. The table keeps the "
                f"old collection's rows; mirror the new collection into a new table (and a new checkpoint)")
