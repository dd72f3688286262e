"""The batch's plan made by tasks, Spark-free: the driver receives file lists and delete positions, no rows.

A writing task keeps its narrow rows (``layout.narrow_schema``: key, ``_seq``, op, file, row) in a *changes
file* of its own (``<data>/_changes/<batch>/<uuid>.parquet``) and returns one row per file it wrote
(:func:`written_schema`). The changes files are shuffled by key (every change of a key in one planning
task, whichever writing task wrote it); a planning task looks its keys up in the table's live files
(``layout.lookup_file``), runs ``layout.plan`` on its share and returns the positions to delete per data file
and the number of changes applied (:func:`plan_out_schema`). The driver merges those rows (:func:`merge_plans`)
into one ``formats.base.Plan`` and commits it. What reaches the driver grows with the files and the deleted rows,
not with the batch's rows: an insert-only batch of any size is a few rows per task.

The changes files are the batch's persisted state between the two stages (a re-run planning task reads the
same rows; a re-run writing task writes a new data file and a new changes file, and the lost attempt's files
are in neither list). Before it opens a data file a writing task claims its name with an empty object in its
attempt's directory; once the batch is committed (or when it runs again) the driver deletes the claimed files no
task result named (:func:`drop_lost_files`): a task that finished its files on an executor that died before its
result reached the driver leaves nothing behind. The driver deletes the batch's directory once the batch is
committed or skipped; one a killed job left is removed when the batch runs again, else listed by ``msgstream
mirror orphans``. Each attempt of a batch writes under ``<batch directory>/e<epoch>/`` (its writer's epoch,
``store/writer.py``; an earlier release wrote straight into the batch's directory: epoch 0), and the deletions
take a range of epochs: which attempts' files may go, and when, is ``write/attempts.py``'s rule.
"""

from __future__ import annotations

import logging
import os
import uuid
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from msgstream_spark.mirror.collapse import OP
from msgstream_spark.mirror.formats.base import LiveFile, Plan
from msgstream_spark.mirror.order import SEQ, SEQ_TYPE
from msgstream_spark.mirror.store import Store, uri
from msgstream_spark.mirror.store.parquet import ParquetOut, Written, remove_tree
from msgstream_spark.mirror.write.keyindex import side_path
from msgstream_spark.mirror.write.layout import (
    COLLECTION,
    FILE,
    lookup_file,
    match_schema,
    narrow_schema,
    newest_seq,
    plan,
    prune,
)

log = logging.getLogger(__name__)

CHANGES_DIR, CLAIMS_DIR = "_changes", "claims"
EPOCH_DIR = "e"  # an attempt's directory in its batch's: e<epoch of its writer>
DATA, CHANGES = "data", "changes"
DELETE, APPLIED, EXISTED = "delete", "applied", "existed"


def changes_dir(data_dir: str, query_id: str, batch_id: int) -> str:
    """Where the writing tasks of batch ``batch_id`` of query ``query_id`` keep their changes files."""
    safe = "".join(c if c.isalnum() or c in "-_" else "_" for c in query_id)
    return uri.join(data_dir, CHANGES_DIR, f"{safe}-{int(batch_id)}")


def claims_dir(directory: str) -> str:
    """Where the writing tasks of a batch (changes files in ``directory``) claim their data files' names."""
    return uri.join(directory, CLAIMS_DIR)


def attempt_dir(directory: str, epoch: int) -> str:
    """Where an attempt of the batch (changes files in ``directory``) by a writer of ``epoch`` keeps its files."""
    return uri.join(directory, f"{EPOCH_DIR}{int(epoch)}")


def _in_batch(directory: str, target: str) -> tuple[int, list[str]]:
    """(epoch of the attempt, path parts under its directory) of an object under a batch's ``directory``."""
    parts = (uri.relative(directory, target) or "").split("/")
    if len(parts) > 1 and parts[0][:1] == EPOCH_DIR and parts[0][1:].isdigit():
        return int(parts[0][1:]), parts[1:]
    return 0, parts  # an earlier release's attempt, straight in the batch's directory


def attempt_epochs(store: Store, directory: str, listed: list | None = None) -> set[int]:
    """The epochs of the attempts that left files in the batch's ``directory`` (``listed``: its listing, if read)."""
    return {_in_batch(directory, m.uri)[0] for m in (store.list(directory) if listed is None else listed)}


def list_batch(store: Store, directory: str) -> list:
    """The objects under a batch's ``directory``: one listing, which :func:`drop_lost_files` and
    :func:`remove_changes` can share (``listed``)."""
    return list(store.list(directory))


def drop_lost_files(store: Store, directory: str, data_dir: str, kept: pa.Table | None = None, *,
                    epochs: tuple[int, int] | None = None, referenced: set[str] | None = None,
                    finish: Any = None, listed: list | None = None) -> list[str]:
    """Delete the data files (and their key indexes) claimed in the batch's ``directory`` by its writing tasks
    that are not among ``kept`` (the writing tasks' output rows the driver used) nor ``referenced`` (paths the
    table's versions read); none of both: every claimed file. ``epochs``: only the claims of attempts of these
    epochs (first, last; default: all). A task that finished its files on an executor that died before its result
    reached the driver is run again and writes new files; its own are in no commit. ``finish``: the table's
    ``WriteSpec.finish``, whose ``discard(store, path, referenced)`` (if it has one) deletes what it made of a
    lost file. ``listed``: the directory's listing (:func:`list_batch`), if already read. The deleted files'
    paths."""
    keep = {p.rsplit("/", 1)[-1] for p in data_files(kept)} if kept is not None else set()
    keep |= {p.rsplit("/", 1)[-1] for p in referenced or ()}
    lost = []
    for m in store.list(directory) if listed is None else listed:
        epoch, parts = _in_batch(directory, m.uri)
        if len(parts) == 2 and parts[0] == CLAIMS_DIR and (epochs is None or epochs[0] <= epoch <= epochs[1]):
            lost.append(parts[1])
    gone = []
    for name in lost:
        if name in keep:
            continue
        path = uri.join(data_dir, name)
        discard = getattr(finish, "discard", None)
        if discard is not None:
            discard(store, path, referenced)
        store.delete(side_path(path))
        store.delete(path)
        gone.append(path)
    if gone:
        log.info("deleted %d data file(s) of %s written by task attempts whose results were lost (a dead "
                 "executor's or a killed earlier attempt's): %s", len(gone), directory, ", ".join(gone))
    return gone


def remove_changes(store: Store, directory: str, epochs: tuple[int, int] | None = None,
                   listed: list | None = None) -> None:
    """Drop a batch's changes files and claims (committed, skipped, or left by a killed attempt of the batch);
    ``epochs``: only those of attempts of these epochs (first, last; default: all); ``listed``: the directory's
    listing (:func:`list_batch`), if already read (with ``epochs``)."""
    if epochs is None:
        remove_tree(store, directory)
        return
    for m in list(store.list(directory)) if listed is None else listed:
        if epochs[0] <= _in_batch(directory, m.uri)[0] <= epochs[1]:
            store.delete(m.uri)
    local = uri.parse(directory)
    if local.kind == "local":  # the emptied directories (one another attempt still writes in stays)
        for at, _, _ in os.walk(local.key, topdown=False):
            try:
                os.rmdir(at)
            except OSError:
                pass  # not empty: a later attempt's files


def written_schema() -> pa.Schema:
    """What a writing task returns: a row per data file and one for its changes file (rows; collection ids;
    the file's size and stats, which the commit records; its footer, when the table's format asked for it)."""
    return pa.schema([pa.field("kind", pa.string()), pa.field("path", pa.string()), pa.field("rows", pa.int64()),
                      pa.field("collections", pa.list_(pa.int64())), pa.field("size", pa.int64()),
                      pa.field("stats", pa.string()), pa.field("footer", pa.binary())])


# a changes file's ``ParquetWriter`` options: a dictionary for the columns that repeat (op, the data file, the
# collection id), none for the key and ``_seq`` (unique: their dictionary never pays; with it the file took twice
# the CPU to write and came out twice as large), no statistics (the planning tasks read a changes file whole)
CHANGES_FILE_OPTIONS = {"compression": "zstd", "use_dictionary": [OP, FILE, COLLECTION],
                        "write_statistics": False}


class ChangesFile:
    """A writing task's narrow rows, appended chunk by chunk to its changes file (opened at the first row)."""

    def __init__(self, store: Store, directory: str, key_type: pa.DataType) -> None:
        self.store, self.directory, self.schema = store, directory, narrow_schema(key_type)
        self.path: str | None = None
        self._out: ParquetOut | None = None
        self.rows = 0
        self.collections: set[int] = set()

    def add(self, narrow: pa.Table) -> None:
        if narrow.num_rows == 0:
            return
        if self._out is None:
            self.path = uri.join(self.directory, f"{uuid.uuid4().hex}.parquet")
            # transient: the batch's state between its writing and planning stages; a crash re-runs the batch
            # (its begin clears an earlier attempt's files), so no fsync waits for it
            self._out = ParquetOut(self.store, self.path, self.schema, transient=True, **CHANGES_FILE_OPTIONS)
        self._out.write_table(narrow.cast(self.schema))
        self.rows += narrow.num_rows
        self.collections.update(pc.unique(narrow.column(COLLECTION).drop_null()).to_pylist())

    def close(self, data_files: list[Written]) -> pa.Table:
        """Finish the file; the task's output rows (``data_files``: the data files it wrote)."""
        mine = self._out.close() if self._out is not None else None
        kinds = [DATA] * len(data_files) + ([CHANGES] if mine else [])
        files = [*data_files, *([mine] if mine else [])]
        colls = [None] * len(data_files) + ([sorted(self.collections)] if mine else [])
        return pa.Table.from_arrays([pa.array(kinds, pa.string()), pa.array([f.path for f in files], pa.string()),
                                     pa.array([f.rows for f in files], pa.int64()),
                                     pa.array(colls, pa.list_(pa.int64())),
                                     pa.array([f.size for f in files], pa.int64()),
                                     pa.array([f.stats for f in files], pa.string()),
                                     pa.array([f.footer or None for f in files], pa.binary())],
                                    schema=written_schema())

    def abort(self) -> None:
        if self._out is not None:
            self._out.abort()


def plan_out_schema(key_type: pa.DataType) -> pa.Schema:
    """What a planning task returns: ``delete`` rows (file, positions), one ``applied`` row (rows), and with
    ``existed`` asked for, the newest table row's ``_seq`` per key of its share (the history needs them)."""
    return pa.schema([pa.field("kind", pa.string()), pa.field("file", pa.string()),
                      pa.field("positions", pa.list_(pa.int64())), pa.field("rows", pa.int64()),
                      pa.field("key", key_type), pa.field(SEQ, SEQ_TYPE)])


def plan_share(narrow: pa.Table, files: list[LiveFile], pk: str, key_type: pa.DataType,
               existed: bool = False, store: Store | None = None) -> pa.Table:
    """Plan one share of the batch (every change of its keys): its keys looked up in ``files``, ``plan`` run."""
    out = plan_out_schema(key_type)
    if narrow.num_rows == 0:
        return out.empty_table()
    keys = pc.unique(narrow.column("key").combine_chunks())
    parts = [lookup_file(f, pk, keys, key_type, store) for f in prune(files, keys)]
    matches = pa.concat_tables(parts) if parts else match_schema(key_type).empty_table()
    p = plan(narrow, matches)
    n = len(p.deletes)
    parts = [_out(out, [DELETE] * n + [APPLIED], file=pa.array(list(p.deletes) + [None], pa.string()),
                  positions=pa.array([v.astype(np.int64) for v in p.deletes.values()] + [None], pa.list_(pa.int64())),
                  rows=pa.array([None] * n + [p.rows], pa.int64()))]
    if existed and matches.num_rows:
        newest = newest_seq(matches)
        parts.append(_out(out, [EXISTED] * newest.num_rows, key=newest.column("key"), seq=newest.column(SEQ)))
    return pa.concat_tables(parts)


def _out(schema: pa.Schema, kinds: list[str], **cols) -> pa.Table:
    """Planning-task output rows of ``kinds``; the columns not given are nulls."""
    n = len(kinds)
    names = {"seq": SEQ}
    got = {names.get(k, k): v for k, v in cols.items()}
    arrays = [pa.array(kinds, pa.string())] + [
        (got[f.name].cast(f.type) if f.name in got else pa.nulls(n, f.type)) for f in list(schema)[1:]]
    return pa.Table.from_arrays(arrays, schema=schema)


def merge_plans(written: pa.Table, planned: pa.Table, base: int | None = None) -> Plan:
    """One ``Plan`` from the writing tasks' files and the planning tasks' rows (a data file's positions may
    come from several planning tasks: united); ``base``: the version of the live files the tasks looked up
    (``LiveFiles.version``), which the commit is fenced at."""
    kinds = written.column("kind").to_pylist()
    paths = written.column("path").to_pylist()
    rows = written.column("rows").to_pylist()
    adds = sorted(p for k, p, r in zip(kinds, paths, rows) if k == DATA and r)
    info = {p: (int(n), st) for k, p, r, n, st in zip(kinds, paths, rows, written.column("size").to_pylist(),
                                                      written.column("stats").to_pylist())
            if k == DATA and r and n is not None and st}
    footers = ({p: f for k, p, r, f in zip(kinds, paths, rows, written.column("footer").to_pylist()) if k == DATA and r
                and f} if "footer" in written.column_names else {})
    deletes: dict[str, list[np.ndarray]] = {}
    dels = planned.filter(pc.equal(planned.column("kind"), DELETE))
    positions = [a for chunk in dels.column("positions").chunks for a in _lists(chunk)]
    for f, pos in zip(dels.column("file").to_pylist(), positions):
        deletes.setdefault(f, []).append(pos)
    got = planned.filter(pc.equal(planned.column("kind"), APPLIED)).column("rows")
    applied = int(pc.sum(got).as_py() or 0) if len(got) else 0
    return Plan(adds, {f: np.unique(np.concatenate(v)).astype(np.uint64) for f, v in deletes.items()}, applied,
                base, info, footers)


def _lists(chunk: pa.ListArray) -> list[np.ndarray]:
    """Each list of a list<int64> chunk as a numpy view (no Python ints per position)."""
    values = chunk.flatten().to_numpy(zero_copy_only=False)
    offs = chunk.offsets.to_numpy() - chunk.offsets[0].as_py()
    return [values[offs[i]:offs[i + 1]] for i in range(len(chunk))]


def existed_keys(planned: pa.Table) -> pa.Table:
    """(key, ``_seq``) rows of the planning tasks' ``existed`` answers, as ``layout.match_schema`` has them."""
    got = planned.filter(pc.equal(planned.column("kind"), EXISTED))
    return pa.table({"key": got.column("key"), SEQ: got.column(SEQ)})


def _paths(written: pa.Table, kind: str) -> list[str]:
    return [p for k, p in zip(written.column("kind").to_pylist(), written.column("path").to_pylist()) if k == kind]


def changes_files(written: pa.Table) -> list[str]:
    return _paths(written, CHANGES)


def data_files(written: pa.Table) -> list[str]:
    """The data files the writing tasks' output rows name."""
    return _paths(written, DATA)


def batch_collections(written: pa.Table) -> set[int]:
    """The collection ids the batch's rows carry (from the writing tasks' rows)."""
    out: set[int] = set()
    for k, c in zip(written.column("kind").to_pylist(), written.column("collections").to_pylist()):
        if k == CHANGES and c:
            out.update(c)
    return out


def changes_count(written: pa.Table) -> int:
    return sum(r for k, r in zip(written.column("kind").to_pylist(), written.column("rows").to_pylist())
               if k == CHANGES)

