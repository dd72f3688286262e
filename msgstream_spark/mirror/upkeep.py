"""Maintenance inside a running mirror: after each batch, what the policy (``mirror.policy``) says is due,
under the job's writer lease and epoch, between two batches (the stream is not stopped: the next batch
waits for it, as it waits for a slow commit).

- ``compact``: ``maintenance.compact`` (one commit fenced at the version it read and at the writer's epoch).
- ``merge_manifests`` (Iceberg): the current snapshot's manifests merged into one per content.
- ``expire``: the versions the policy keeps are chosen (``policy.keep_from``); the format's ``trim`` expires
  the older ones (Iceberg: their snapshots, one commit fenced at the head and the epoch; Delta: the log files
  before the newest checkpoint a kept version needs), then ``maintenance.vacuum`` deletes the files no kept
  version reads, with a retention reaching back to the oldest kept version's commit. A reader pinned to a
  kept version reads it throughout.

Every run is counted (``runs``, ``errors``, ``last``) for the metrics and ``mirror status``. A failed task is
logged with the table and the error and counted; it does not stop the stream (the next due time tries
again), unless it lost the lease (LeaseLost: another writer took the table over), which is raised.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

from msgstream_spark.mirror.formats import registry
from msgstream_spark.mirror.maintenance import compact, vacuum
from msgstream_spark.mirror.policy import MaintenancePolicy, TableFigures, keep_from, parse, reasons
from msgstream_spark.mirror.store import LeaseLost, NotFound, StoreError, uri
from msgstream_spark.mirror.store.writer import writer_lock

log = logging.getLogger(__name__)
TASKS = ("compact", "merge_manifests", "expire")
STATE_NAME = "_msgstream_maintenance.json"  # the job's maintenance state, beside the table
RETAIN_SLACK_S = 1.0  # files removed this long before the oldest kept version's commit stay too (clock grain)


@dataclass
class TaskRun:
    task: str
    reason: str
    seconds: float
    ok: bool
    detail: dict[str, Any] = field(default_factory=dict)


class Upkeep:
    """The maintenance of one table while a job writes it; ``after_batch`` is a MirrorBatch observer."""

    def __init__(self, table, policy: MaintenancePolicy | None = None) -> None:
        self.table = table
        self.policy = policy or MaintenancePolicy()
        self.formats = registry.upkeep(table)  # None: a format without history upkeep (compaction only)
        self.since = {"compact": 0, "expire": 0}
        self.runs: dict[str, int] = dict.fromkeys(TASKS, 0)
        self.errors: dict[str, int] = dict.fromkeys(TASKS, 0)
        self.seconds: dict[str, float] = dict.fromkeys(TASKS, 0.0)
        self.last: dict[str, float] = {}  # task -> wall time of its last success
        self.history: list[TaskRun] = []  # the last runs (at most 50)
        self.table_figures: dict[str, int] = {}  # the history's size after the last expiry (``figures``)
        self._configured = False

    def figures(self) -> TableFigures:
        """The table's live files as the policy reads them (the batch's own state: no extra read on Delta;
        Iceberg's manifests read once per snapshot)."""
        known = getattr(self.table, "known_files", None)  # Delta: as the batch's read left them (no read)
        files = known() if known is not None else self.table.live_files()
        half = self.policy.target_bytes // 2
        return TableFigures(  # a small file is small with deleted rows too (the compaction rewrites those all)
            files=len(files), small_files=sum(1 for f in files if 0 < f.size < half),
            rows=sum(f.num_rows for f in files), deleted_rows=sum(len(f.deleted) for f in files),
            manifests=self.formats.manifests(self.table) if self.formats is not None else 0,
            batches_since_compaction=self.since["compact"], batches_since_expiry=self.since["expire"])

    def after_batch(self, report=None, hold=None) -> list[TaskRun]:
        """Count a committed batch (``report.committed``; None: one committed) and run what is due."""
        if report is not None and not report.committed:
            return []
        for k in self.since:
            self.since[k] += 1
        return self.run_due(hold)

    def run_due(self, hold=None) -> list[TaskRun]:
        """Run the tasks due now (under the table's writer lease: ``hold``, or taken here)."""
        if not self.policy.enabled:
            return []
        with writer_lock(self.table.store, self.table.location, "the job's maintenance", share=hold) as h:
            out = [self._run(task, why, h) for task, why in reasons(self.policy, self.figures())
                   if task != "merge_manifests" or self.formats is not None]
        return out

    def _run(self, task: str, why: str, hold) -> TaskRun:
        t0 = time.perf_counter()
        try:
            detail = {"compact": self._compact, "merge_manifests": self._merge_manifests,
                      "expire": self._expire}[task](hold)
            ok = True
        except LeaseLost:
            raise
        except Exception as e:  # counted and logged; the stream goes on, the next due time tries again
            log.exception("maintenance %s of table %s failed (%s): %s", task, self.table.location, why, e)
            detail, ok = {"error": f"{type(e).__name__}: {e}"}, False
        run = TaskRun(task, why, round(time.perf_counter() - t0, 3), ok, detail)
        self.runs[task] += 1
        self.seconds[task] = round(self.seconds[task] + run.seconds, 3)
        if ok:
            self.last[task] = time.time()
            if task in self.since:
                self.since[task] = 0
        else:
            self.errors[task] += 1
        self.history = [*self.history[-49:], run]
        log.info("maintenance %s of %s (%s): %s in %.3f s %s", task, self.table.location, why,
                 "done" if ok else "FAILED", run.seconds, detail)
        self._publish()
        return run

    def _publish(self) -> None:
        """The state beside the table (``STATE_NAME``), where ``msgstream mirror status`` reads it; a failure to
        write it is logged, never fatal."""
        try:
            self.table.store.put(uri.join(self.table.root, STATE_NAME),
                                 json.dumps({**self.state(), "updated": time.time()}, sort_keys=True).encode())
        except StoreError as e:
            log.warning("cannot write the maintenance state of %s (%s): %s", self.table.location, STATE_NAME, e)

    def _compact(self, hold) -> dict[str, Any]:
        done = compact(self.table, self.policy.target_bytes)
        return {"files_in": done.files_in, "files_out": done.files_out, "deleted_rows": done.deleted_rows}

    def _merge_manifests(self, hold) -> dict[str, Any]:
        return {"manifests_merged": self.formats.merge_manifests(self.table, hold.epoch)}

    def _expire(self, hold) -> dict[str, Any]:
        now_ms = int(time.time() * 1000)
        out: dict[str, Any] = {}
        since_ms = now_ms
        if self.formats is not None:
            configure = getattr(self.formats, "configure", None)  # once: what the format's own settings bound
            if configure is not None and not self._configured:
                self._configured = True
                out["configured"] = configure(self.table, self.policy.retain_age_s)
            versions = self.formats.versions(self.table)
            if versions:
                i = keep_from(self.policy, versions, now_ms)
                keep = self._log_floor(versions, i, now_ms)
                out.update(self.formats.trim(self.table, versions[keep][0], hold.epoch))
                since_ms = versions[i][1]
                out["versions_kept"] = len(versions) - i
        retain_s = max(0.0, (now_ms - since_ms) / 1000) + RETAIN_SLACK_S  # what the oldest kept version reads
        out["files_deleted"] = len(vacuum(self.table, retain_s, now=now_ms / 1000))
        expired = getattr(self.formats, "expired", None)  # Delta: later checkpoints drop those files' tombstones
        if expired is not None:
            expired(self.table, int(now_ms - retain_s * 1000) - 1)  # the vacuum's cutoff (a ms below: rounding)
        self.measure()
        return out

    def measure(self) -> dict[str, int]:
        """The history's size now (versions kept, metadata files and bytes: a listing), kept as
        ``table_figures``."""
        if self.formats is not None:
            self.table_figures = self.formats.figures(self.table)
        return self.table_figures

    def version(self) -> int | None:
        """The table's version as a growing number (Delta: log version; Iceberg: last sequence number)."""
        return self.formats.version_number(self.table) if self.formats is not None else None

    def _log_floor(self, versions: list[tuple[int, int]], i: int, now_ms: int) -> int:
        """The oldest version whose log is kept: the policy's, or older when the table's own log retention
        (Delta's ``delta.logRetentionDuration``) asks for more."""
        age_of = getattr(self.formats, "log_age_ms", None)
        age = age_of(self.table) if age_of is not None else None
        if age is None:
            return i
        j = keep_from(MaintenancePolicy(retain_age_s=age / 1000, retain_min=self.policy.retain_min,
                                        retain_max=max(len(versions), self.policy.retain_min)), versions, now_ms)
        return min(i, j)

    def state(self) -> dict[str, Any]:
        """The maintenance state for ``mirror status`` and the metrics: runs, errors, seconds, last success."""
        return {"policy": self.policy.as_options(), "runs": dict(self.runs), "errors": dict(self.errors),
                "seconds": dict(self.seconds), "last_success": dict(self.last),
                "batches_since": dict(self.since), "history": dict(self.table_figures),
                "last_runs": [vars(r) for r in self.history[-5:]]}


def read_state(table) -> dict[str, Any] | None:
    """The maintenance state a job last wrote beside ``table`` (None: none)."""
    try:
        return json.loads(table.store.read(uri.join(table.root, STATE_NAME)))
    except NotFound:
        return None


def maintenance_status(table) -> dict[str, Any]:
    """``msgstream mirror status``'s maintenance part: the state the job last wrote (``job``: its policy, runs,
    errors, last successes; None: no job wrote one), the history's size now (``history``), the live files as
    the policy reads them, and what that policy would run now (``due``)."""
    state = read_state(table)
    policy = MaintenancePolicy()
    if state and state.get("policy"):
        policy = parse(state["policy"])
    up = Upkeep(table, policy)
    if state:
        up.since.update(state.get("batches_since", {}))
    figs = up.figures()
    return {"job": state, "history": up.measure(),
            "live_files": {"files": figs.files, "small_files": figs.small_files, "rows": figs.rows,
                           "deleted_rows": figs.deleted_rows, "manifests": figs.manifests},
            "due": [{"task": t, "reason": why} for t, why in reasons(policy, figs)]}
