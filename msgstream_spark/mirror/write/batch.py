"""One micro-batch through the merge-on-read write path: its steps written once (:func:`run_batch`), run by one
of two runners (:class:`Runner`).

The steps: begin (skip a batch already in the table; the Spark runner also clears an earlier attempt's files),
write (collapse each share and write the keys' new rows, returning the narrow rows), plan (look the keys up in
the table's live files and join: the plan and the collection ids the rows carry), commit (under the writer's
lease, fenced at the version the lookup read and at the writer's epoch), end (clean up). :class:`LocalRunner`
runs every step in this process (the library call ``apply_batch``); ``msgstream_spark.spark.mirror``'s runner
runs the writing and planning steps in Spark tasks and keeps only the narrow results in the driver.
"""

from __future__ import annotations

from typing import Any, Protocol

import pyarrow as pa
import pyarrow.compute as pc

from msgstream_spark.mirror.common import PROP_COLLECTION_ID
from msgstream_spark.mirror.formats.base import LiveFiles, Plan, WriteSpec
from msgstream_spark.mirror.store.parquet import Written
from msgstream_spark.mirror.store.writer import Hold, writer_lock
from msgstream_spark.mirror.write.layout import (
    COLLECTION,
    TaskWriter,
    check_collections,
    lookup_file,
    match_schema,
    plan,
    prune,
)


def lookup_local(table: Any, keys: pa.Array, files: LiveFiles | None = None) -> pa.Table:
    """The table's live rows of ``keys`` (key, _seq, file, position), read file by file in this process from
    ``files`` (default: the table's live files now)."""
    spec_type = table.schema.field(table.pk).type
    files = prune(table.live_files() if files is None else files, keys)
    parts = [lookup_file(f, table.pk, keys, spec_type, table.store) for f in files]
    return pa.concat_tables(parts) if parts else match_schema(spec_type).empty_table()


def commit_plan(table: Any, p: Plan, collections: set[int], *, query_id: str, batch_id: int,
                commit_info: dict[str, str] | None = None, hold: Hold | None = None) -> Plan | None:
    """Commit a plan the tasks made (``collections``: the ids the batch's rows carry, checked against the
    table's); None if the batch is already in the table. MirrorError, nothing committed, if the table moved
    since the plan's lookup read it (``p.base``). ``hold``: the writer lease the caller holds (default: taken
    for the commit)."""
    check_collections(collections, _collection_id(table), table.location, table.collection)
    if hold is not None:
        return _commit_held(table, hold, p, query_id, batch_id, commit_info)
    return _commit(table, p, query_id, batch_id, commit_info)


def _commit(table: Any, p: Plan, query_id: str, batch_id: int, commit_info: dict[str, str] | None) -> Plan | None:
    """The plan committed under the table's writer lease."""
    with writer_lock(table.store, table.location, f"the commit of batch {batch_id}") as hold:
        return _commit_held(table, hold, p, query_id, batch_id, commit_info)


def _commit_held(table: Any, hold: Hold, p: Plan, query_id: str, batch_id: int,
                 commit_info: dict[str, str] | None) -> Plan | None:
    """The plan committed by ``hold``'s writer: its lease checked right before the commit publishes (a writer
    that knows it lost its lease commits nothing), its epoch checked by the table in the commit (a writer
    deposed meanwhile commits nothing either)."""
    done = hold.commit(table, lambda epoch: table.commit(p, query_id=query_id, batch_id=batch_id,
                                                        commit_info=commit_info, epoch=epoch))
    return p if done else None


class Runner(Protocol):
    """Where a batch's steps run (:func:`run_batch` calls them in order)."""

    def begin(self, table: Any, hold: Hold | None, query_id: str, batch_id: int) -> bool:
        """Before anything is written: False if the batch is already in the table (skipped)."""

    def columns(self) -> pa.Schema:
        """The batch's columns (the table gains the collection fields it lacks before files are written)."""

    def write(self, spec: WriteSpec) -> Any:
        """The batch's changes collapsed and written as data files under ``spec``; what the plan step needs."""

    def plan(self, table: Any, written: Any) -> tuple[Plan, set[int]]:
        """The plan (fenced at the version its lookup read) and the collection ids the batch's rows carry."""

    def end(self, table: Any, hold: Hold | None, written: Any, committed: bool) -> None:
        """After the commit (``committed``: this run put the batch in the table): clean up."""


def run_batch(table: Any, runner: Runner, *, query_id: str, batch_id: int, hold: Hold | None = None,
              commit_info: dict[str, str] | None = None) -> Plan | None:
    """Batch ``batch_id`` of ``query_id`` through ``runner``'s steps; the plan committed, or None if the batch is
    already in the table. ``hold``: the writer lease the caller holds (None: taken for the commit)."""
    spec = begin_write(table, runner, query_id=query_id, batch_id=batch_id, hold=hold)
    if spec is None:
        return None
    try:
        written = runner.write(spec)
    except BaseException:
        pin_log(table, False)
        raise
    return finish_batch(table, runner, written, query_id=query_id, batch_id=batch_id, hold=hold,
                        commit_info=commit_info)


def pin_log(table: Any, pinned: bool) -> None:
    """A batch's reads of the table's log between :func:`begin_write` (``pinned``) and the end of
    :func:`finish_batch` (False): one read at the begin answers the checks, the live files and the schema, the
    commit reads it again for its own checks (Delta: ``pin_log``; a format without it reads as it always does)."""
    pin = getattr(table, "pin_log", None)
    if pin is not None:
        pin(pinned)


def begin_write(table: Any, runner: Runner, *, query_id: str, batch_id: int,
                hold: Hold | None = None) -> WriteSpec | None:
    """A batch's first steps: begun (None: the batch is already in the table), the table given the batch's
    columns; the spec its files are written with. A job writing many tables' files in one Spark job (the database
    job, ``spark.mirror_many_write``) takes each table through this, writes, then :func:`finish_batch`."""
    pin_log(table, True)
    try:
        if not runner.begin(table, hold, query_id, batch_id):
            pin_log(table, False)
            return None
        table.prepare(runner.columns())
        return table.write_spec()
    except BaseException:
        pin_log(table, False)
        raise


def finish_batch(table: Any, runner: Runner, written: Any, *, query_id: str, batch_id: int,
                 hold: Hold | None = None, commit_info: dict[str, str] | None = None) -> Plan | None:
    """A batch's last steps once its files are written: planned, committed (fenced, once), ended; the plan
    committed, or None if the batch is already in the table."""
    try:
        p, collections = runner.plan(table, written)
        done = commit_plan(table, p, collections, query_id=query_id, batch_id=batch_id, commit_info=commit_info,
                           hold=hold)
        runner.end(table, hold, written, done is not None)
    finally:
        pin_log(table, False)
    return done


class LocalRunner:
    """Every step in this process: ``changes`` (``rows`` output: op, fields, ``_ts``, ``_seq``) written by one
    ``TaskWriter``, looked up file by file."""

    def __init__(self, changes: pa.Table) -> None:
        self.changes = changes
        self.files: list[Written] = []  # the files the writer closed (their size and stats reach the commit)

    def begin(self, table: Any, hold: Hold | None, query_id: str, batch_id: int) -> bool:
        done = table.last_batch(query_id)
        return done is None or done < batch_id

    def columns(self) -> pa.Schema:
        return self.changes.schema

    def write(self, spec: WriteSpec) -> pa.Table:
        w = TaskWriter(spec)
        try:
            return w.add(self.changes)
        finally:
            self.files = w.close()

    def plan(self, table: Any, written: pa.Table) -> tuple[Plan, set[int]]:
        files = table.live_files()
        matches = lookup_local(table, written.column("key").combine_chunks(), files)
        ids = set(pc.unique(written.column(COLLECTION).drop_null()).to_pylist()) if written.num_rows else set()
        p = plan(written, matches, files.version)
        p.info = {f.path: (f.size, f.stats) for f in self.files if f.rows and f.stats}
        return p, ids

    def end(self, table: Any, hold: Hold | None, written: pa.Table, committed: bool) -> None:
        """Nothing to clean up: a local writer's files of a failed commit are orphans (``orphans``, vacuum)."""


def _collection_id(table: Any) -> int | None:
    v = table.properties().get(PROP_COLLECTION_ID)
    return None if v is None else int(v)
