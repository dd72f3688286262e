"""The mirrored table as Lance, through ``pylance`` (no JVM): fragments, deletion files, one version per batch.

A batch's commit is one Lance version (``LanceOperation.Update`` in a ``Transaction``): the fragments its writing
tasks made (``staged.py``: the driver reads none of their rows), the existing fragments whose deletion files gained
the positions the plan deletes (``LanceFragment.delete_rows``: a deletion file, no data rewritten), and the batch
record in the transaction's properties (``records.py``: exactly once, a batch already in the table is skipped).
Fenced: based on the version the plan's lookup read (``read_version``), refused when the table moved since, or holds
a writer epoch above the writer's; Lance itself refuses a commit racing that check that conflicts with what landed
(the epoch's ``Merge``, a compaction of the same fragments). One writer at a time (``store/writer.py``).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pyarrow as pa

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.common import (
    PROP_BATCH,
    PROP_COLLECTION,
    PROP_PREFIX,
    PROP_QUERY,
    PROP_SNAPSHOT_TS,
    check_epoch,
    check_identity,
    check_prefix,
    identity_properties,
    new_fields,
    schema_difference,
    table_schema,
)
from msgstream_spark.mirror.formats.base import DATA_DIR, LiveFile, LiveFiles, Plan, WriteSpec, fence_message
from msgstream_spark.mirror.formats.detect import refuse_occupied
from msgstream_spark.mirror.formats.lance import records as rec
from msgstream_spark.mirror.formats.lance import staged
from msgstream_spark.mirror.formats.lance.fragments import (
    FRAGMENT_ROWS,
    data_path,
    deleted_positions,
    file_schema,
    fixed_vectors,
    fragments_of,
    key_file,
    key_file_info,
)
from msgstream_spark.mirror.formats.lance.maintain import expire, retained, write_key_file_of
from msgstream_spark.mirror.formats.lance.options import conflict_error, dataset_uri, lance, storage_options
from msgstream_spark.mirror.store import LeaseLost, NotFound, Store, open_store, uri

log = logging.getLogger(__name__)

VERSIONS_DIR = "_versions"


class LanceMirrorTable:
    """A Lance dataset at ``location`` (a local path or a URI) mirroring one collection."""

    def __init__(self, location: str, collection: str, pk: str, collection_id: int | None,
                 store: Store | None = None) -> None:
        self.location = location
        self.collection = collection
        self.pk = pk
        self.collection_id = collection_id
        self.store = store if store is not None else open_store(location)
        self.root = uri.parse(location).uri()
        self.uri = dataset_uri(location)
        self._opts = storage_options(self.store)
        self._ds: Any = None
        self._keys: dict[str, tuple] = {}  # key file -> (key min, key max, rows, size)
        self._dels: dict[tuple, np.ndarray] = {}  # (fragment id, deletion file) -> deleted positions
        self._frag: dict[str, int] = {}  # a live file's path (its key file) -> fragment id
        self._rec = rec.KnownRecords()  # the record of the newest version read or committed
        self.fragment_rows = FRAGMENT_ROWS  # rows at most of a fragment made of Parquet files (a snapshot's)

    @classmethod
    def open(cls, location: str, *, collection: str, pk: str, arrow_schema: pa.Schema | None, create: bool,
             collection_id: int | None, storage_options: dict | None = None) -> LanceMirrorTable:
        t = cls(location, collection, pk, collection_id, open_store(location, storage_options))
        if t._exists():
            t._ds = t._latest()
            t._finish_creation()
            check_identity(location, t.properties(), collection, pk, collection_id)
            if arrow_schema is not None:
                t.evolve(table_schema(arrow_schema, pk))
            return t
        refuse_occupied(t.store, location, "lance")
        if create:
            if arrow_schema is None:
                raise MirrorError(f"no Lance table at {location} and no schema to create it from")
            schema = table_schema(arrow_schema, pk)
            ds = lance().write_dataset(schema.empty_table(), t.uri, schema=schema, mode="create",
                                       storage_options=t._opts)
            ds.update_config(identity_properties(collection, pk, collection_id))
            t._ds = t._latest()
        return t

    def _finish_creation(self) -> None:
        """A table whose creation was cut off before its properties were set (Lance makes the dataset, then the
        config is set: two versions): an empty one gets them now; one with rows (a snapshot's first version
        without its properties) is refused naming what to do."""
        if PROP_COLLECTION in self._ds.config():
            return
        if self._ds.get_fragments():
            raise MirrorError(f"Lance table at {self.location} has rows but no {PROP_COLLECTION} property: its "
                              "first version (a snapshot's) was committed and the process stopped before the "
                              "properties were set; nothing of the stream was applied to it. Remove the table's "
                              "location and run the mirror again")
        self._ds.update_config(identity_properties(self.collection, self.pk, self.collection_id))
        self._ds = self._latest()

    @staticmethod
    def stored_properties(location: str, storage_options: dict | None = None) -> dict[str, str]:
        """The ``msgstream.*`` properties of the Lance table at ``location``; MirrorError if there is none."""
        t = LanceMirrorTable(location, "", "", None, open_store(location, storage_options))
        if not t._exists():
            raise MirrorError(f"no Lance table at {location}")
        t._ds = t._latest()
        return t.properties()

    def _exists(self) -> bool:
        return any(m.uri.endswith(".manifest") for m in self.store.list(uri.join(self.root, VERSIONS_DIR)))

    def _latest(self) -> Any:
        """The dataset at its newest version."""
        return lance().dataset(self.uri, storage_options=self._opts)

    def _table(self) -> Any:
        """The dataset at its newest version: the one held if no version landed since (a listing of the
        versions; opening it again would read its manifest, which grows with the table's fragments)."""
        if self._ds is None:
            raise MirrorError(f"no Lance table at {self.location} (open it with create=True or add_files first)")
        if self._ds.latest_version != self._ds.version:
            self._ds = self._latest()
        return self._ds

    @property
    def schema(self) -> pa.Schema:
        return self._table().schema

    def properties(self) -> dict[str, str]:
        conf = self._table().config()
        return {k: v for k, v in conf.items() if k.startswith(PROP_PREFIX) and not rec.is_record(k)}

    def set_properties(self, properties: dict[str, str]) -> None:
        check_prefix(properties)
        self._table().update_config(dict(properties))

    def _records(self, ds: Any = None) -> dict[str, str]:
        return self._rec.read(ds if ds is not None else self._table())

    def last_batch(self, query_id: str) -> int | None:
        return rec.last_batch(self._records(), query_id)

    def merged_queries(self) -> set[str]:
        return {k.removeprefix(rec.BATCH_OF) for k in self._records() if k.startswith(rec.BATCH_OF)}

    def writer_epoch(self) -> int:
        return rec.epoch(self._records())

    def publish_epoch(self, epoch: int) -> None:
        """``epoch`` in the table: a no-op ``Merge`` carrying it (Lance refuses every batch commit and epoch
        based on an earlier version); LeaseLost if the table holds a higher one."""
        op = lance().LanceOperation
        for _ in range(5):
            ds = self._table()
            got = self._records(ds)
            if rec.epoch(got) > epoch:
                raise LeaseLost(f"table {self.location}: another writer published writer epoch {rec.epoch(got)}, "
                                f"above this writer's {epoch}")
            if rec.epoch(got) == epoch:
                return
            merge = op.Merge([f.metadata for f in ds.get_fragments()], ds.lance_schema)
            try:
                self._commit(ds.version, merge, rec.with_epoch(got, epoch))
                return
            except conflict_error() as e:
                log.info("publishing writer epoch %s in %s raced another commit (%s): trying again", epoch,
                         self.location, e)
        raise MirrorError(f"table {self.location}: writer epoch {epoch} not published (other commits kept landing)")

    def _commit(self, base: int, operation: Any, props: dict[str, str]) -> Any:
        """One version: ``operation`` based on version ``base`` with transaction properties ``props``."""
        from lance.dataset import Transaction

        held = self._ds if self._ds is not None and self._ds.version == base else self.uri  # (its manifest read)
        ds = lance().LanceDataset.commit(held, Transaction(base, operation, transaction_properties=props),
                                         storage_options=self._opts, max_retries=0)
        self._ds = ds
        self._rec.committed(ds.version, props)
        return ds

    def prepare(self, columns: pa.Schema) -> None:
        extra = new_fields(columns.empty_table(), self.schema)
        if extra:
            self._add_columns(extra)

    def write_spec(self) -> WriteSpec:
        snap = self.properties().get(PROP_SNAPSHOT_TS)
        schema = self.schema
        first = not self._ds.get_fragments()
        return WriteSpec(schema, self.pk, uri.join(self.root, DATA_DIR), None if snap is None else int(snap),
                         schema.field(self.pk).type, storage=dict(self.store.options),
                         finish=staged.FragmentTask(self.root, self.uri, first))

    def live_files(self) -> LiveFiles:
        """Each fragment as the lookup reads it: its key file (key bounds, rows), its deleted positions."""
        ds = self._table()
        out, frag, dels = [], {}, {}
        for f in ds.get_fragments():
            md = f.metadata
            path = key_file(self.root, md.files[0].path)
            info = self._keys.get(path) or self._key_info(f, path)
            self._keys[path] = info
            key = (md.id, f.deletion_file())
            deleted = dels[key] = self._dels.get(key) if key in self._dels else deleted_positions(f)
            frag[path] = md.id
            out.append(LiveFile(path, info[0], info[1], deleted, md.physical_rows, size=info[3]))
        self._frag, self._dels = frag, dels
        self._keys = {k: v for k, v in self._keys.items() if k in frag}
        return LiveFiles(out, ds.version)

    def _key_info(self, fragment: Any, path: str) -> tuple:
        """A fragment's key file's (key min, key max, rows, size); a fragment another tool wrote (its own
        ``compact_files`` between two batches) gets its key file first."""
        try:
            return key_file_info(self.store, path)
        except NotFound:
            write_key_file_of(self, fragment)
            return key_file_info(self.store, path)

    def commit(self, plan: Plan, *, query_id: str, batch_id: int, commit_info: dict[str, str] | None = None,
               epoch: int | None = None) -> bool:
        """One Lance version: the new files as fragments (the positions the plan deletes of them left out),
        the deletion files of the fragments that lose rows, the batch record; fenced at ``plan.base``."""
        ds = self._table()
        got = self._records(ds)
        done = rec.last_batch(got, query_id)
        if done is not None and done >= batch_id:
            return False
        what = f"batch {batch_id} of query {query_id}"
        check_epoch(self.location, rec.epoch(got), epoch, what)
        if plan.base is not None and plan.base != ds.version:
            raise MirrorError(fence_message(self.location, "version", plan.base, ds.version, what))
        props = {**(commit_info or {}), PROP_QUERY: query_id, PROP_BATCH: str(batch_id),
                 **rec.with_batch(got, query_id, batch_id)}
        got = staged.reports(self.store, plan.adds, plan.info)
        op = self._first_rows(ds, plan, got)
        if op is None:
            updated, removed = self._deletions(ds, plan, what)
            new = self._new_fragments(ds.schema, plan, got)
            op = lance().LanceOperation.Update(removed_fragment_ids=removed, updated_fragments=updated,
                                               new_fragments=new)
        try:
            done = self._commit(ds.version, op, props)
        except conflict_error() as e:
            raise MirrorError(f"table {self.location}: another writer committed while {what} was committed "
                              f"(Lance refused it: {e}); nothing committed, the batch runs again on restart") from e
        self._known_deletions(done, plan)
        staged.drop_staged(self, plan.adds, got)
        return True

    def _known_deletions(self, ds: Any, plan: Plan) -> None:
        """The deleted positions of the fragments this commit gave new deletion files, known without reading
        them back (a batch touching every fragment would otherwise read every fragment's row addresses)."""
        old = {k[0]: v for k, v in self._dels.items()}
        for path, positions in plan.deletes.items():
            fid = self._frag.get(path)
            frag = ds.get_fragment(fid) if fid in old else None  # (None: it lost every row, or it is new)
            if frag is not None:
                self._dels[(fid, frag.deletion_file())] = np.union1d(old[fid], np.asarray(positions, np.uint64))

    def _first_rows(self, ds: Any, plan: Plan, got: dict[str, dict]) -> Any:
        """The first rows of a table without fragments whose vectors are variable lists: an ``Overwrite`` with
        the vectors as fixed-size lists of their length (``fixed_vectors``; the tasks' reports of the fragments
        they made) and the new fragments; None otherwise (the vector type is settled)."""
        if not plan.adds or ds.get_fragments():
            return None
        parquet = [self._store_path(p) for p in plan.adds if p not in got]
        schema = staged.first_schema(ds.schema, got) if got else fixed_vectors(ds.schema, self.store, parquet)
        if schema.equals(ds.schema):
            return None
        return lance().LanceOperation.Overwrite(schema, self._new_fragments(schema, plan, got, mode="overwrite"))

    def _new_fragments(self, schema: pa.Schema, plan: Plan, got: dict[str, dict], mode: str = "append") -> list:
        """The plan's added files as fragments: those the tasks made (``staged``), and the Parquet files of the
        others turned into fragments here."""
        new = staged.fragments(self, schema, plan.deletes, got, mode)
        return new + fragments_of(self, schema, [p for p in plan.adds if p not in got], plan.deletes, mode)

    def _deletions(self, ds: Any, plan: Plan, what: str) -> tuple[list, list[int]]:
        """The fragments losing rows with their new deletion files, and the ids of those losing every row."""
        updated, removed = [], []
        adds = set(plan.adds)
        for path, positions in plan.deletes.items():
            if path in adds:
                continue
            fid = self._frag.get(path)
            if fid is None:  # fragments read by another call than the plan's lookup: read them again
                self.live_files()
                fid = self._frag.get(path)
            if fid is None:
                raise MirrorError(f"{path} left table {self.location} after {what} looked it up (another writer: "
                                  "a compaction?); nothing committed, the batch runs again on restart")
            md = ds.get_fragment(fid).delete_rows(np.asarray(positions, dtype=np.int64).tolist())
            if md is None:
                removed.append(fid)
            else:
                updated.append(md)
        return updated, removed

    def _store_path(self, path: str) -> str:
        return path if "://" in path else uri.parse(path).uri()

    def swap_files(self, old: list[LiveFile], new: list[str], base: int | None = None,
                   epoch: int | None = None) -> None:
        """Not how a Lance table is compacted (its ``Format.compact``: Lance's ``compact_files``): refused."""
        raise MirrorError(f"table {self.location} is a Lance table: it is compacted by Lance's compact_files "
                          "(msgstream mirror compact), not by swapping files; nothing committed")

    def referenced_files(self) -> set[str]:
        return self._files_of(self._table())

    def _files_of(self, ds: Any) -> set[str]:
        """The data, deletion and key files a version reads (URIs of the store)."""
        out = set()
        for f in ds.get_fragments():
            md = f.metadata
            out.update(data_path(self.root, d.path) for d in md.files)
            out.add(key_file(self.root, md.files[0].path))
            if f.deletion_file():
                out.add(uri.join(self.root, f.deletion_file()))
        return out

    def retained_files(self, retain_s: float, now: float) -> set[str]:
        return retained(self, retain_s, now)

    def expire(self, retain_s: float, now: float) -> None:
        expire(self, retain_s, now)

    def metadata_files(self) -> list[str]:
        """Lance's own metadata (versions, transactions) is cleaned by ``cleanup_old_versions`` (``expire``)."""
        return []

    def add_files(self, paths: list[str], *, properties: dict[str, str]) -> None:
        """The Parquet files (a snapshot's) as the table's fragments, with ``properties`` (its config)."""
        check_prefix(properties)
        if not paths:
            raise MirrorError("add_files needs at least one data file")
        if self._ds is None:
            schema = fixed_vectors(file_schema(self.store, self._store_path(paths[0])), self.store,
                                   [self._store_path(p) for p in paths])
            new = fragments_of(self, schema, paths, mode="overwrite")
            op = lance().LanceOperation.Overwrite(schema, new)
            lance().LanceDataset.commit(self.uri, op, storage_options=self._opts)
            self._ds = self._latest()
            self._ds.update_config({**identity_properties(self.collection, self.pk, self.collection_id),
                                    **properties})
            return
        self._replace(paths, properties, remove=False)

    def replace_files(self, paths: list[str], *, properties: dict[str, str]) -> None:
        """One version: every fragment removed, the Parquet files' rows (a new snapshot) added; then
        ``properties`` set (a config update of its own)."""
        check_prefix(properties)
        if not paths:
            raise MirrorError("replace_files needs at least one data file")
        self._replace(paths, properties, remove=True)

    def _replace(self, paths: list[str], properties: dict[str, str], remove: bool) -> None:
        ds = self._table()
        new = fragments_of(self, ds.schema, paths)
        removed = [f.fragment_id for f in ds.get_fragments()] if remove else []
        op = lance().LanceOperation.Update(removed_fragment_ids=removed, new_fragments=new)
        self._commit(ds.version, op, {**self._records(ds), rec.RECORDS: "1", **properties})
        self._table().update_config(dict(properties))

    def evolve(self, new_schema: pa.Schema) -> None:
        add = schema_difference(self.location, self.collection, self.schema, new_schema)
        if add:
            self._add_columns(add)

    def _add_columns(self, fields: list[pa.Field]) -> None:
        self._table().add_columns([f.with_nullable(True) for f in fields])

    def to_arrow(self, columns: list[str] | None = None) -> pa.Table:
        return self._table().to_table(columns=columns)
