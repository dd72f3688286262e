"""What one committed micro-batch did, as the job's observers receive it (``spark.mirror.MirrorBatch``
calls each observer's ``after_batch(report, hold)`` after every batch, ``batch_failed(batch_id, error)``
when one fails): the metrics endpoint, the per-batch JSON log line, the in-job maintenance.

Rows by op come from the commit itself, per key after the batch's collapse: the data rows the batch
wrote are inserts and updates, the rows it deleted from the table are updates and deletes, and the batch's
changes are one per key. So ``delete`` = changes - rows written, ``update`` = rows deleted - ``delete``,
``insert`` = rows written - ``update`` (a delete of a key the table does not hold counts as a delete).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from msgstream_spark.mirror.formats.base import Plan
from msgstream_spark.mirror.write.taskplan import DATA

OPS = ("insert", "update", "delete")


@dataclass
class BatchReport:
    """One micro-batch as the driver saw it."""

    batch_id: int
    committed: bool  # False: skipped (already in the table, or nothing to commit)
    changes: int = 0
    ops: dict[str, int] = field(default_factory=lambda: dict.fromkeys(OPS, 0))
    seconds: float = 0.0  # the whole batch, on the driver
    step_seconds: dict[str, float] = field(default_factory=dict)  # write, plan, commit
    watermark: dict[str, Any] | None = None  # the batch's end offset: channel -> {"ts": ...}
    freshness_ms: int | None = None


def op_counts(changes: int, written_rows: int, plan: Plan | None) -> dict[str, int]:
    """Rows applied by op (module docstring) from the batch's changes (one per key), the data rows it wrote
    and the positions its plan deletes (those in files the batch itself adds left out)."""
    if plan is None:
        return dict.fromkeys(OPS, 0)
    removed = sum(len(v) for p, v in plan.deletes.items() if p not in plan.adds)
    delete = max(0, changes - written_rows)
    update = max(0, min(written_rows, removed - delete))
    return {"insert": written_rows - update, "update": update, "delete": delete}


def data_rows(written) -> int:
    """The rows of the data files a batch's writing tasks wrote (their result table: ``kind``, ``rows``)."""
    kinds, rows = written.column("kind").to_pylist(), written.column("rows").to_pylist()
    return sum(int(r or 0) for k, r in zip(kinds, rows) if k == DATA)
