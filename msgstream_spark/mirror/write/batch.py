"""One micro-batch through the merge-on-read write path, its steps run in one of two places.

``apply_local`` runs every step in this process (the library call, ``apply_batch``);
``msgstream_spark.spark.mirror`` runs the writing and lookup steps in Spark tasks and keeps only the narrow
results (keys, positions, file names) in the driver. Both end in ``table.commit(plan)``.
"""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from msgstream_spark.mirror.common import PROP_COLLECTION_ID
from msgstream_spark.mirror.formats.base import LiveFiles, Plan
from msgstream_spark.mirror.store.writer import Hold, writer_lock
from msgstream_spark.mirror.write.layout import (
    check_collections,
    check_narrow_collection,
    lookup_file,
    match_schema,
    plan,
    prune,
    write_changes,
)


def lookup_local(table: Any, keys: pa.Array, files: LiveFiles | None = None) -> pa.Table:
    """The table's live rows of ``keys`` (key, _seq, file, position), read file by file in this process from
    ``files`` (default: the table's live files now)."""
    spec_type = table.schema.field(table.pk).type
    files = prune(table.live_files() if files is None else files, keys)
    parts = [lookup_file(f, table.pk, keys, spec_type, table.store) for f in files]
    return pa.concat_tables(parts) if parts else match_schema(spec_type).empty_table()


def finish(table: Any, narrow: pa.Table, matches: pa.Table, *, query_id: str, batch_id: int,
           commit_info: dict[str, str] | None = None, base: int | None = None) -> Plan | None:
    """Plan the batch from the narrow results and commit it (``commit_info``: ``msgstream.*`` entries recorded
    with the commit, e.g. the batch's watermark; ``base``: the table version ``matches`` were read at, the
    commit is refused if the table moved since); None if the batch is already in the table."""
    check_narrow_collection(narrow, _collection_id(table), table.location, table.collection)
    return _commit(table, plan(narrow, matches, base), query_id, batch_id, commit_info)


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


def apply_local(table: Any, changes: pa.Table, *, query_id: str, batch_id: int,
                commit_info: dict[str, str] | None = None) -> bool:
    """Apply ``changes`` (``rows`` output: op, fields, ``_ts``, ``_seq``) in this process; False if already applied."""
    done = table.last_batch(query_id)
    if done is not None and done >= batch_id:
        return False
    table.prepare(changes.schema)
    narrow = write_changes(changes, table.write_spec())
    files = table.live_files()
    matches = lookup_local(table, narrow.column("key").combine_chunks(), files)
    return finish(table, narrow, matches, query_id=query_id, batch_id=batch_id, commit_info=commit_info,
                  base=files.version) is not None


def _collection_id(table: Any) -> int | None:
    v = table.properties().get(PROP_COLLECTION_ID)
    return None if v is None else int(v)
