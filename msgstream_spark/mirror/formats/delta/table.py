"""The mirrored table as Delta Lake, through delta-rs (``deltalake``, no JVM).

Exactly once: every batch's commit carries a Delta application transaction (app id = the query id, version =
the batch id) in the same commit as the data. delta-rs does not itself refuse a repeated (app id, version)
(delta-rs issues 2580, 3821), so ``commit`` reads the last version of the app id from the log first
(``LogState.txns``) and skips a batch already in the table. One writer at a time.

A batch reads the log at its begin (``pin_log``: its epoch and exactly-once checks, live files and schema answer
from that read) and at its commit (which checks the batch, the writer epoch and the fence on what it reads then).
"""

from __future__ import annotations

import time

import numpy as np
import pyarrow as pa

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.common import (
    PROP_BATCH,
    PROP_PREFIX,
    PROP_QUERY,
    PROP_SNAPSHOT_TS,
    PROP_WRITER_EPOCH,
    check_epoch,
    check_identity,
    check_prefix,
    identity_properties,
    new_fields,
    schema_difference,
    table_schema,
)
from msgstream_spark.mirror.formats.base import DATA_DIR, LiveFile, LiveFiles, Plan, WriteSpec, fence_message
from msgstream_spark.mirror.formats.delta import checkpoint
from msgstream_spark.mirror.formats.delta.dv import dv_file_path, read_dv, write_dv_file
from msgstream_spark.mirror.formats.delta.handle import deltalake as _deltalake
from msgstream_spark.mirror.formats.delta.handle import is_table, scan, stored_properties, table_at
from msgstream_spark.mirror.formats.delta.log import (
    LogState,
    add_of,
    data_files,
    dv_id,
    enable_dvs,
    key_bounds,
    loose_stats,
    removal,
    write_commit,
    write_epoch,
    write_first_version,
    write_replace_version,
)
from msgstream_spark.mirror.formats.delta.retention import TOMBSTONE_RETENTION_KEY, interval_ms, removed_after
from msgstream_spark.mirror.formats.detect import refuse_occupied
from msgstream_spark.mirror.store import Store, open_store, uri

CHECKPOINT_EVERY = 100  # commits between checkpoints (Delta's default delta.checkpointInterval)


class DeltaMirrorTable:
    """A Delta table at ``location`` (a local path or a URI) mirroring one collection; every file of it is read
    and written through ``store`` (its settings resolved on the driver)."""

    def __init__(self, location: str, collection: str, pk: str, collection_id: int | None,
                 store: Store | None = None) -> None:
        self.location = location
        self.collection = collection
        self.pk = pk
        self.collection_id = collection_id
        self._dt, self._behind = None, False  # delta-rs's handle; behind: a version of ours not in it yet
        self._pinned = self._looked = False  # a batch's one read of the log (pin_log): asked for, made
        self._schemas: dict[str, pa.Schema] = {}  # a schemaString's Arrow schema
        self.store = store if store is not None else open_store(location)
        self.root = uri.parse(location).uri()  # a local path made absolute, or the URI
        self._log: LogState | None = None
        self._dvs: dict[tuple, np.ndarray] = {}  # the live files' deletion vectors, by descriptor
        self._stats: dict[str, tuple] = {}  # an add's stats JSON -> (key min, key max, rows)
        # set by the job's expiry (delta/upkeep.expired): files removed at or before it are deleted, so the
        # checkpoints written from then on leave their tombstones out (delta/checkpoint)
        self.tombstone_floor_ms: int | None = None

    @classmethod
    def open(cls, location: str, *, collection: str, pk: str, arrow_schema: pa.Schema | None, create: bool,
             collection_id: int | None, storage_options: dict | None = None) -> DeltaMirrorTable:
        dl = _deltalake()
        t = cls(location, collection, pk, collection_id, open_store(location, storage_options))
        if is_table(location, t.root, t.store.storage_options()):
            t._dt = t._handle()
            check_identity(location, t.properties(), collection, pk, collection_id)
            if arrow_schema is not None:
                t.evolve(table_schema(arrow_schema, pk))
            return t
        refuse_occupied(t.store, location, "delta")  # an Iceberg table there (now or by add_files): refused
        if create:
            if arrow_schema is None:
                raise MirrorError(f"no Delta table at {location} and no schema to create it from")
            props = identity_properties(collection, pk, collection_id)
            t._dt = dl.DeltaTable.create(t.root, table_schema(arrow_schema, pk), configuration=props,
                                         name=collection, raise_if_key_not_exists=False,
                                         storage_options=t.store.storage_options())
        return t

    def _handle(self):
        """A delta-rs handle of the table at its current version (the store's settings as its options)."""
        return table_at(self.location, self.root, self.store.storage_options())

    @staticmethod
    def stored_properties(location: str, storage_options: dict | None = None) -> dict[str, str]:
        """The ``msgstream.*`` properties of the Delta table at ``location``; MirrorError if there is none."""
        so = open_store(location, storage_options).storage_options()
        return stored_properties(location, uri.parse(location).uri(), so)

    def _exists(self) -> None:
        if self._dt is None:
            raise MirrorError(f"no Delta table at {self.location} (open it with create=True or add_files first)")

    def _table(self):
        """delta-rs's handle, up to date with the versions this writer published."""
        self._exists()
        if self._behind:
            self._behind = False
            self._dt.update_incremental()
        return self._dt

    def pin_log(self, pinned: bool = True) -> None:
        """A batch begins (``pinned``): the log is read once (at the next read) and every read until its end
        (False) answers from that read and this writer's own commits; outside a batch each read reads it."""
        self._pinned, self._looked = pinned, False

    @property
    def schema(self) -> pa.Schema:
        if self._pinned:  # the batch's read of the log (delta-rs's handle is not brought up to date for it)
            raw = self._state().metadata["schemaString"]
            if raw not in self._schemas:
                self._schemas = {raw: pa.schema(_deltalake().Schema.from_json(raw).to_arrow())}
            return self._schemas[raw]
        return pa.schema(self._table().schema().to_arrow())

    def properties(self) -> dict[str, str]:
        conf = self._state().metadata["configuration"] if self._pinned else self._table().metadata().configuration
        return {k: v for k, v in conf.items() if k.startswith(PROP_PREFIX)}

    def set_properties(self, properties: dict[str, str]) -> None:
        check_prefix(properties)
        self._table().alter.set_table_properties(dict(properties), raise_if_not_exists=False)
        self._looked = False  # delta-rs's version: read at the next look

    def last_batch(self, query_id: str) -> int | None:
        """From the log state the commit checks too, which reads only the commits since its last read (delta-rs's
        ``transaction_version`` replays every commit since the last checkpoint on each call)."""
        self._exists()
        return self._state().txns.get(query_id)

    def _state(self) -> LogState:
        """The log state, the versions published since the last read read first (in a batch: once, ``pin_log``)."""
        if self._log is None:
            self._log = LogState(self.store, self.root)
        if not (self._pinned and self._looked):
            self._log.refresh()
            self._looked = self._pinned
        return self._log

    def prepare(self, columns: pa.Schema) -> None:
        """Add the collection fields ``columns`` carry that the table lacks (before tasks write files)."""
        extra = new_fields(columns.empty_table(), self.schema)
        if extra:
            self._add_columns(extra)

    def write_spec(self) -> WriteSpec:
        snap = self.properties().get(PROP_SNAPSHOT_TS)
        schema = self.schema
        return WriteSpec(schema, self.pk, uri.join(self.root, DATA_DIR), None if snap is None else int(snap),
                         schema.field(self.pk).type, storage=dict(self.store.options))

    def live_files(self, state: LogState | None = None) -> LiveFiles:
        """The live data files with key bounds and deleted positions, and the log version they are of. Parsed
        stats and read vectors are kept for the files still live only: a batch costs O(files), and a
        long-running job's memory stays that."""
        out, dvs, stats = [], {}, {}
        state = self._state() if state is None else state
        resolve = uri.resolver(self.root)  # the root parsed once, not once a file
        for rel, add in state.files.items():
            raw = add.get("stats") or "{}"
            got = stats[raw] = self._stats.get(raw) or key_bounds(raw, self.pk)
            dv = add.get("deletionVector")
            path = resolve(rel)
            deleted = self._deleted(dv, path)
            if dv:
                dvs[dv_id(dv)] = deleted
            out.append(LiveFile(path, got[0], got[1], deleted, got[2], size=int(add.get("size") or 0)))
        self._dvs, self._stats = dvs, stats
        return LiveFiles(out, state.version)

    def known_files(self) -> LiveFiles:
        """The live files as this writer's last read of the log and its commits left them (no read)."""
        return self.live_files(self._log)

    def _deleted(self, dv: dict | None, path: str = "") -> np.ndarray:
        """A deletion vector's positions, cached (a vector never changes; a new one has a new offset or file)."""
        if not dv:
            return np.zeros(0, np.uint64)
        key = dv_id(dv)
        got = self._dvs.get(key)
        if got is None:
            got = self._dvs[key] = read_dv(self.store, self.root, dv, path)
        return got

    def _rel(self, path: str) -> str:
        """A data file's path as the log names it (relative to the table)."""
        rel = uri.relative(self.root, path)
        return path if rel is None else rel

    def writer_epoch(self) -> int:
        """The epoch of the newest writer that published one (``store/writer.py``; 0: none)."""
        self._exists()
        return self._state().txns.get(PROP_WRITER_EPOCH, 0)

    def publish_epoch(self, epoch: int) -> None:
        """Make ``epoch`` the table's writer epoch (a version of its own); LeaseLost if it has a higher one."""
        if write_epoch(self.store, self.root, self._state(), epoch, self.location):
            self._behind = True

    def commit(self, plan: Plan, *, query_id: str, batch_id: int, commit_info: dict[str, str] | None = None,
               epoch: int | None = None) -> bool:
        """One Delta version: the new files, a deletion vector per file that loses rows, the batch's ``txn``.
        Fenced: published as version ``plan.base + 1`` (a put that fails if another writer took it), refused
        when the table moved since the plan's lookup, or when it holds a writer epoch above ``epoch``."""
        self._looked = False  # the commit checks the log as it is now (in a batch too)
        state = self._state()
        done = state.txns.get(query_id)
        if done is not None and done >= batch_id:
            return False
        check_epoch(self.location, state.txns.get(PROP_WRITER_EPOCH, 0), epoch, f"batch {batch_id} of query {query_id}")
        self._fence(plan.base, state.version, f"batch {batch_id} of query {query_id}")
        now = int(time.time() * 1000)
        vectors, current = self._vectors(state, plan, batch_id)
        dv_of = dict(zip(vectors, write_dv_file(self.store, self.root, list(vectors.values())))) if vectors else {}
        actions: list[dict] = []
        if plan.deletes:
            actions += enable_dvs(state.protocol, state.metadata)
        for path in plan.adds:
            actions.append({"add": add_of(self.store, self.root, path, self.pk, now, dv_of.get(path),
                                          plan.info.get(path))})
        for path, cur in current.items():
            actions.append({"remove": removal(cur, now)})
            actions.append({"add": {**cur, "modificationTime": now, "dataChange": True, "deletionVector": dv_of[path],
                                    "stats": loose_stats(cur.get("stats"))}})
        actions.append({"txn": {"appId": query_id, "version": int(batch_id), "lastUpdated": now}})
        version = state.version + 1
        write_commit(self.store, self.root, version, actions, "MERGE",
                     {**(commit_info or {}), PROP_QUERY: query_id, PROP_BATCH: str(batch_id)})
        state.adopt(version, actions)  # ours: the next batch's log state does not read it back
        for path, dv in dv_of.items():  # the next batch's live files: the vectors known, not read back one by one
            self._dvs[dv_id(dv)] = np.unique(np.asarray(vectors[path], dtype=np.uint64))
        self._behind = True  # delta-rs's handle brought up to date when it is used (not by a batch)
        # readers (and LogState) start from the last checkpoint: one at the first batch at or after each multiple
        # of CHECKPOINT_EVERY (that version may be another writer's, a compaction's or an epoch's)
        if version // CHECKPOINT_EVERY > max(state.checkpoint, 0) // CHECKPOINT_EVERY:
            if checkpoint.wants_v2(state):
                self._table().create_checkpoint()  # (v2 checkpoints: delta-rs's, with every unexpired tombstone)
            else:  # written once, without the tombstones of files the expiry deleted (delta/checkpoint)
                checkpoint.write(self.store, self.root, state, version, now, self.tombstone_floor_ms)
            state.checkpoint = version
        return True

    def _vectors(self, state: LogState, plan: Plan, batch_id: int) -> tuple[dict, dict]:
        """(path -> the file's deleted positions after the commit, path -> the live add of each file that was in
        the table): every vector of the commit (a touched file's old deletes merged in) goes in one DV file, one
        write and one fsync per batch, not one per touched file (random keys touch every file of a large table)."""
        vectors, current = {}, {}
        for path, positions in plan.deletes.items():
            if path in plan.adds:
                vectors[path] = positions
                continue
            cur = current[path] = state.files.get(self._rel(path))
            if cur is None:
                raise MirrorError(f"{path} left table {self.location} after batch {batch_id} looked it up (another "
                                  "writer: a compaction?); nothing committed, the batch runs again on restart")
            old = self._deleted(cur.get("deletionVector"), path)
            vectors[path] = np.union1d(old, positions) if len(old) else positions
        return vectors, current

    def _fence(self, base: int | None, current: int, what: str) -> None:
        """MirrorError if the table is no longer at version ``base`` (None: not fenced), the one planned on."""
        if base is not None and base != current:
            raise MirrorError(fence_message(self.location, "version", base, current, what))

    def merged_queries(self) -> set[str]:
        """The query ids whose batches were merged into the table (the log's ``txn`` actions)."""
        return set(self._state().txns) - {PROP_WRITER_EPOCH}

    def swap_files(self, old: list[LiveFile], new: list[str], base: int | None = None,
                   epoch: int | None = None) -> None:
        """One version (a compaction): the ``old`` files removed, the ``new`` ones added; no data change.
        ``base``: the version ``old`` was read at (refused if the table moved since); ``epoch``: the writer's."""
        state = self._state()
        check_epoch(self.location, state.txns.get(PROP_WRITER_EPOCH, 0), epoch, "the compaction")
        self._fence(base, state.version, "the compaction")
        now = int(time.time() * 1000)
        actions = []
        for f in old:
            cur = state.files.get(self._rel(f.path))
            if cur is None:
                raise MirrorError(f"{f.path} is no longer in table {self.location}: another writer changed it; "
                                  "nothing compacted")
            actions.append({"remove": {**removal(cur, now), "dataChange": False}})
        actions += [{"add": {**add_of(self.store, self.root, p, self.pk, now, None), "dataChange": False}}
                    for p in new]
        write_commit(self.store, self.root, state.version + 1, actions, "OPTIMIZE", {})
        self._behind = True

    def referenced_files(self) -> set[str]:
        """The data and deletion vector files the table's current version references (full URIs)."""
        out = set()
        for rel, add in self._state().files.items():
            out.add(uri.resolve(self.root, rel))
            if add.get("deletionVector") and add["deletionVector"]["storageType"] != "i":
                out.add(dv_file_path(self.root, add["deletionVector"]))
        return out

    def retained_files(self, retain_s: float, now: float) -> set[str]:
        """Every data and deletion vector file a version committed within ``retain_s`` of ``now`` reads: the
        current version's, and those a ``remove`` later than ``now - retain_s`` took out (``delta/retention``)."""
        keep = self.referenced_files()
        conf = self._table().metadata().configuration
        for r in removed_after(self.store, self.root, int((now - retain_s) * 1000),
                               interval_ms(conf.get(TOMBSTONE_RETENTION_KEY)), int(now * 1000)):
            keep.add(uri.resolve(self.root, r["path"]))
            dv = r.get("deletionVector")
            if dv and dv["storageType"] != "i":
                keep.add(dv_file_path(self.root, dv))
        return keep

    def expire(self, retain_s: float, now: float) -> None:
        """Nothing to expire in Delta's log itself (vacuum removes the files older versions alone used)."""

    def metadata_files(self) -> list[str]:
        """The log is not vacuumed (Delta's log cleanup keeps it; time travel reads it)."""
        return []

    def add_files(self, paths: list[str], *, properties: dict[str, str]) -> None:
        """The Parquet files (under ``location``) become the table's version 0, with ``properties``."""
        dl = _deltalake()
        if self._dt is not None:
            raise MirrorError(f"{self.location} is already a Delta table: add_files makes a new table's first version")
        check_prefix(properties)
        schema, adds = data_files(self.store, self.root, paths, self.pk)
        conf = {**identity_properties(self.collection, self.pk, self.collection_id), **properties}
        write_first_version(self.store, self.root, self.collection, dl.Schema.from_arrow(schema).to_json(), conf,
                            adds)
        self._dt, self._behind, self._looked = self._handle(), False, False

    def replace_files(self, paths: list[str], *, properties: dict[str, str]) -> None:
        """One commit: the table's rows become the Parquet files' (a new snapshot), with ``properties``."""
        dl = _deltalake()
        self._exists()
        check_prefix(properties)
        schema, adds = data_files(self.store, self.root, paths, self.pk)
        state = self._state()
        conf = {**(state.metadata.get("configuration") or {}),
                **identity_properties(self.collection, self.pk, self.collection_id), **properties}
        meta = {**state.metadata, "configuration": conf}  # (the same table id; the new schema written with it)
        now = int(time.time() * 1000)
        removes = [removal(a, now) for a in state.files.values()]
        write_replace_version(self.store, self.root, state.version + 1, meta, dl.Schema.from_arrow(schema).to_json(),
                              removes, adds)
        self._dt, self._behind, self._looked = self._handle(), False, False

    def evolve(self, new_schema: pa.Schema) -> None:
        add = schema_difference(self.location, self.collection, self.schema, new_schema)
        if add:
            self._add_columns(add)

    def _add_columns(self, fields: list[pa.Field]) -> None:
        dl = _deltalake()
        self._table().alter.add_columns([dl.Field.from_arrow(f.with_nullable(True)) for f in fields])
        self._looked = False  # delta-rs's version: read at the next look

    def to_arrow(self, columns: list[str] | None = None) -> pa.Table:
        """The table's rows as plain delta-rs reads them (its DataFusion scan once deletion vectors are on);
        ``columns``: only these, projected in the scan."""
        dt = self._table()
        dt.update_incremental()
        return scan(dt, self.schema, columns)
