"""The mirrored table as Apache Iceberg, through ``pyiceberg`` and its SQL catalog (no JVM).

The catalog is a SQLite file (``catalog_uri``, a SQLAlchemy URL; default ``<location>_catalog.sqlite``, next to
the table, where Iceberg's orphan-file removal does not reach; a table of an earlier release keeps its
``<location>/catalog.sqlite``), created only when a table is: meant for development and one writer: point
``catalog_uri`` at your own SQL catalog otherwise.
Exactly once: each merge is one Iceberg transaction (its deletes, its appends and the table property
``msgstream.batch.<query id>`` = batch id), whose snapshots carry the query id and batch id in their
summary; a batch whose id is not above the stored one is skipped. A merge reads only the key and
``_seq`` of the batch's pks, computes what to delete and append in Arrow, and deletes by key
(copy-on-write) then appends; pyiceberg's own ``upsert`` is not used (no delete clause).
"""

from __future__ import annotations

import os
import re

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.common import (
    PROP_BATCH,
    PROP_PREFIX,
    PROP_QUERY,
    PROP_SNAPSHOT_TS,
    check_identity,
    check_prefix,
    identity_properties,
    new_fields,
    schema_difference,
    table_schema,
)
from msgstream_spark.mirror.formats.iceberg.commit import (
    commit_files,
    data_data_file,
    delete_data_file,
    fenced,
    head_id,
    write_position_deletes,
)
from msgstream_spark.mirror.formats.iceberg.expiry import (
    metadata_dir_files,
    metadata_json_files,
    snapshot_files,
    split_snapshots,
)
from msgstream_spark.mirror.store import open_store
from msgstream_spark.mirror.write.batch import apply_local
from msgstream_spark.mirror.write.layout import (
    DATA_DIR,
    NO_SNAPSHOT,
    LiveFile,
    LiveFiles,
    Plan,
    WriteSpec,
    fence_message,
)

NAMESPACE = "msgstream"
PROP_BATCH_OF = "msgstream.batch."


def _catalog_uri(location: str, catalog_uri: str | None) -> str:
    if catalog_uri:
        return catalog_uri
    loc = os.path.abspath(location).rstrip("/")
    inside = os.path.join(loc, "catalog.sqlite")  # where an earlier release put it
    return f"sqlite:///{inside if os.path.exists(inside) else loc + '_catalog.sqlite'}"


def _catalog(location: str, catalog_uri: str | None, create: bool = True):
    """The SQL catalog (None: the default SQLite file does not exist and ``create`` is False: no table yet)."""
    try:
        from pyiceberg.catalog.sql import SqlCatalog
    except ImportError as e:
        raise MirrorError("the iceberg table format needs 'pyiceberg' and 'sqlalchemy': pip install "
                          "'msgstream-spark[mirror]'") from e
    uri = _catalog_uri(location, catalog_uri)
    if not create and uri.startswith("sqlite:///") and not os.path.exists(uri.removeprefix("sqlite:///")):
        return None
    os.makedirs(location, exist_ok=True)
    cat = SqlCatalog("msgstream", uri=uri, warehouse=f"file://{os.path.abspath(location)}")
    cat.create_namespace_if_not_exists(NAMESPACE)
    return cat


def _identifier(collection: str) -> tuple[str, str]:
    return NAMESPACE, re.sub(r"[^A-Za-z0-9_]", "_", collection)


class IcebergMirrorTable:
    """An Iceberg table at ``location`` mirroring one collection."""

    def __init__(self, location: str, collection: str, pk: str, collection_id: int | None, catalog,
                 catalog_uri: str | None = None) -> None:
        self.location = location
        self.collection = collection
        self.pk = pk
        self.collection_id = collection_id
        self._catalog = catalog
        self._catalog_uri = catalog_uri
        self._tbl = None
        self.root = os.path.abspath(location)
        self.store = open_store(location)  # (store-write: the shared write path's store; store-iceberg owns this)
        self._deletes: dict[str, dict[str, np.ndarray]] = {}
        self._live: list[LiveFile] = []
        self._entries: dict[str, list] = {}  # manifest path -> its live entries' data files (read once)

    @classmethod
    def open(cls, location: str, *, collection: str, pk: str, arrow_schema: pa.Schema | None,
             catalog_uri: str | None, create: bool, collection_id: int | None) -> IcebergMirrorTable:
        t = cls(location, collection, pk, collection_id, _catalog(location, catalog_uri, create), catalog_uri)
        if t._catalog is None:
            return t  # no catalog file yet, none made before a table is: add_files makes both
        ident = _identifier(collection)
        t._tbl = t._at_location()
        if t._tbl is None and t._catalog.table_exists(ident):
            raise MirrorError(f"the catalog already has a table {'.'.join(ident)} for {collection!r}, at "
                              f"{t._catalog.load_table(ident).location()}, not at {location}")
        if t._tbl is not None:
            check_identity(location, t.properties(), collection, pk, collection_id)
            if arrow_schema is not None:
                t.evolve(table_schema(arrow_schema, pk))
        elif create:
            if arrow_schema is None:
                raise MirrorError(f"no Iceberg table {'.'.join(ident)} at {location} and no schema to create it from")
            t._create(table_schema(arrow_schema, pk), {})
        return t

    @staticmethod
    def stored_properties(location: str, catalog_uri: str | None) -> dict[str, str]:
        """The ``msgstream.*`` properties of the catalog's table at ``location``; MirrorError if there is none."""
        t = IcebergMirrorTable(location, "", "", None, _catalog(location, catalog_uri))
        tbl = t._at_location()
        if tbl is None:
            raise MirrorError(f"no Iceberg table at {location} in the catalog")
        return {k: v for k, v in tbl.properties.items() if k.startswith(PROP_PREFIX)}

    def _at_location(self):
        """The catalog's table stored at this location (whatever its name), or None."""
        want = os.path.abspath(self.location).rstrip("/")
        for ident in self._catalog.list_tables(NAMESPACE):
            tbl = self._catalog.load_table(ident)
            if tbl.location().removeprefix("file://").rstrip("/") == want:
                return tbl
        return None

    def _create(self, schema: pa.Schema, properties: dict[str, str]) -> None:
        props = {**identity_properties(self.collection, self.pk, self.collection_id), **properties}
        self._tbl = self._catalog.create_table(_identifier(self.collection), schema=schema,
                                               location=os.path.abspath(self.location), properties=props)

    def _table(self):
        if self._tbl is None:
            raise MirrorError(f"no Iceberg table for {self.collection!r} at {self.location}")
        return self._tbl

    @property
    def schema(self) -> pa.Schema:
        return self._table().schema().as_arrow()

    def properties(self) -> dict[str, str]:
        tbl = self._table()
        tbl.refresh()
        return {k: v for k, v in tbl.properties.items() if k.startswith(PROP_PREFIX)}

    def set_properties(self, properties: dict[str, str]) -> None:
        check_prefix(properties)
        with self._table().transaction() as tx:
            tx.set_properties(dict(properties))

    def last_batch(self, query_id: str) -> int | None:
        v = self.properties().get(PROP_BATCH_OF + query_id)
        return None if v is None else int(v)

    def merged_queries(self) -> set[str]:
        """The query ids whose batches were merged into the table (its ``msgstream.batch.<query id>`` properties)."""
        return {k.removeprefix(PROP_BATCH_OF) for k in self.properties() if k.startswith(PROP_BATCH_OF)}

    def merge(self, collapsed: pa.Table, *, query_id: str, batch_id: int,
              commit_info: dict[str, str] | None = None) -> bool:
        """Apply changes in this process through the merge-on-read write path (``writepath.apply_local``)."""
        return apply_local(self, collapsed, query_id=query_id, batch_id=batch_id, commit_info=commit_info)

    def prepare(self, columns: pa.Schema) -> None:
        """Add the collection fields ``columns`` carry that the table lacks (before tasks write files)."""
        extra = new_fields(columns.empty_table(), self.schema)
        if extra:
            self._add_columns(extra)

    def write_spec(self) -> WriteSpec:
        from pyiceberg.io.pyarrow import schema_to_pyarrow

        tbl = self._table()
        tbl.refresh()
        snap = self.properties().get(PROP_SNAPSHOT_TS)
        schema = schema_to_pyarrow(tbl.schema(), include_field_ids=True)
        split = [tbl.schema().find_column_name(f.source_id) for f in tbl.spec().fields]
        if any(str(f.transform) != "identity" for f in tbl.spec().fields):
            raise MirrorError(f"table {self.location} is partitioned by {tbl.spec()}: the mirror writes tables "
                              "unpartitioned or with identity partitions only")
        return WriteSpec(schema, self.pk, os.path.join(self.root, DATA_DIR), None if snap is None else int(snap),
                         self.schema.field(self.pk).type, split)

    def live_files(self) -> LiveFiles:
        """The live data files with key bounds and deleted positions, from the current snapshot's manifests
        (whose id they carry).
        A manifest never changes, so its entries are read once (pyiceberg's ``plan_files`` reads every
        manifest again at each call: a cost growing with the table's commits); position deletes are matched
        to data files by path, which is what a position delete names."""
        from pyiceberg.conversions import from_bytes
        from pyiceberg.manifest import DataFileContent, ManifestContent

        tbl = self._table()
        tbl.refresh()
        snap = tbl.current_snapshot()
        if snap is None:
            return LiveFiles([], NO_SNAPSHOT)
        field = tbl.schema().find_field(self.pk)
        data, deletes, entries = [], [], {}
        for m in snap.manifests(tbl.io):
            got = entries[m.manifest_path] = (self._entries.get(m.manifest_path)
                                              or [e.data_file for e in m.fetch_manifest_entry(tbl.io)])
            (data if m.content == ManifestContent.DATA else deletes).extend(got)
        self._entries = entries  # manifests of older snapshots: forgotten
        deleted: dict[str, list[np.ndarray]] = {}
        for d in deletes:
            if d.content != DataFileContent.POSITION_DELETES or d.file_format.name != "PARQUET":
                raise MirrorError(f"table {self.location} holds a delete file this mirror does not write "
                                  f"({d.content.name}, {d.file_format.name}: {d.file_path}); another writer changed "
                                  "the table: mirror into a new table")
            for path, pos in self._positions(d.file_path).items():
                deleted.setdefault(path, []).append(pos)
        out = []
        for f in data:
            lo, hi = f.lower_bounds.get(field.field_id), f.upper_bounds.get(field.field_id)
            gone = deleted.get(f.file_path)
            out.append(LiveFile(f.file_path.removeprefix("file://"),
                                None if lo is None else from_bytes(field.field_type, lo),
                                None if hi is None else from_bytes(field.field_type, hi),
                                np.unique(np.concatenate(gone)).astype(np.uint64) if gone else
                                np.zeros(0, np.uint64), f.record_count, f.partition))
        self._live = out
        used = {d.file_path for d in deletes}
        self._deletes = {k: v for k, v in self._deletes.items() if k in used}  # expired delete files: forgotten
        return LiveFiles(out, snap.snapshot_id)

    def _positions(self, delete_file: str) -> dict[str, np.ndarray]:
        """Data file path -> positions of one position-delete file (cached: delete files never change)."""
        got = self._deletes.get(delete_file)
        if got is None:
            t = pq.read_table(delete_file.removeprefix("file://"))
            got = {}
            for p in pc.unique(t.column("file_path")).to_pylist():
                got[p] = t.filter(pc.equal(t.column("file_path"), p)).column("pos").to_numpy()
            self._deletes[delete_file] = got
        return got

    def commit(self, plan: Plan, *, query_id: str, batch_id: int, commit_info: dict[str, str] | None = None) -> bool:
        """One Iceberg snapshot: the new data files, one position-delete file, the batch's id in the properties.
        Fenced: based on the snapshot the plan's lookup read (``plan.base``), refused if the table moved."""
        done = self.last_batch(query_id)
        if done is not None and done >= batch_id:
            return False
        tbl = self._table()
        what = f"batch {batch_id} of query {query_id}"
        if plan.base is not None and head_id(tbl.metadata) != plan.base:
            raise MirrorError(fence_message(self.location, "snapshot", plan.base, head_id(tbl.metadata), what))
        adds = [data_data_file(tbl, p) for p in plan.adds]
        if plan.deletes:  # one position-delete file per partition of the data files it names
            part = {f.path: f.partition for f in self._live}
            part.update({d.file_path: d.partition for d in adds})
            groups: dict = {}
            for path, pos in plan.deletes.items():
                groups.setdefault(part[path], {})[path] = pos
            for record, deletes in groups.items():
                dfile = write_position_deletes(os.path.join(self.root, DATA_DIR), deletes)
                adds.append(delete_data_file(dfile, tbl.metadata.default_spec_id, record))
        with fenced(self.location, what), tbl.transaction() as tx:
            if adds:
                commit_files(tx, tbl, adds=adds, removes=set(), base=plan.base, what=what,
                             properties={**(commit_info or {}), PROP_QUERY: query_id, PROP_BATCH: str(batch_id)})
            tx.set_properties({PROP_BATCH_OF + query_id: str(int(batch_id))})
        return True

    def swap_files(self, old: list[LiveFile], new: list[str], base: int | None = None) -> None:
        """One ``replace`` snapshot (a compaction): the ``old`` data files and every position-delete file removed
        (each names only files with deletes, which a compaction always takes), the ``new`` files added.
        ``base``: the snapshot ``old`` was read at (refused if the table moved since)."""
        from pyiceberg.table.snapshots import Operation

        tbl = self._table()
        tbl.refresh()
        if base is not None and head_id(tbl.metadata) != base:
            raise MirrorError(fence_message(self.location, "snapshot", base, head_id(tbl.metadata), "the compaction"))
        want = {f.path for f in old}
        removes: set[str] = set()
        for task in tbl.scan().plan_files():
            if task.file.file_path.removeprefix("file://") in want:
                removes.add(task.file.file_path)
            removes.update(d.file_path for d in task.delete_files)
        missing = want - {p.removeprefix("file://") for p in removes}
        if missing:
            raise MirrorError(f"{sorted(missing)[:3]} are no longer in table {self.location}: another writer changed "
                              "it; nothing compacted")
        with fenced(self.location, "the compaction"), tbl.transaction() as tx:
            commit_files(tx, tbl, adds=[data_data_file(tbl, p) for p in new], removes=removes, base=base,
                         operation=Operation.REPLACE, what="the compaction",
                         properties={"msgstream.operation": "compaction"})

    def referenced_files(self) -> set[str]:
        """The data and delete files any snapshot the table keeps references, with the manifests and manifest
        lists (absolute paths)."""
        tbl = self._table()
        tbl.refresh()
        return snapshot_files(tbl, tbl.snapshots())

    def retained_files(self, retain_s: float, now: float) -> set[str]:
        """Every file a snapshot current at some moment within ``retain_s`` of ``now`` reads (``expiry``), and
        the metadata files the table keeps."""
        tbl = self._table()
        tbl.refresh()
        kept, _ = split_snapshots(tbl.metadata, int((now - retain_s) * 1000))
        return snapshot_files(tbl, kept) | metadata_json_files(tbl)

    def expire(self, retain_s: float, now: float) -> None:
        """Expire (one commit) the snapshots not current at any moment within ``retain_s`` of ``now``: those
        ``retained_files`` leaves out (before and after this commit alike)."""
        tbl = self._table()
        tbl.refresh()
        _, expired = split_snapshots(tbl.metadata, int((now - retain_s) * 1000))
        if expired:
            tbl.maintenance.expire_snapshots().by_ids([s.snapshot_id for s in expired]).commit()

    def metadata_files(self) -> list[str]:
        """The metadata files, manifest lists and manifests on disk (what vacuum may delete of them)."""
        tbl = self._table()
        tbl.refresh()
        return metadata_dir_files(tbl)

    def add_files(self, paths: list[str], *, properties: dict[str, str]) -> None:
        """Register the Parquet files (written elsewhere, e.g. by Spark tasks) with ``properties``."""
        check_prefix(properties)
        if not paths:
            raise MirrorError("add_files needs at least one data file")
        if self._catalog is None:
            self._catalog = _catalog(self.location, self._catalog_uri)
        if self._tbl is None:  # one transaction creates the table with its files and properties: a failure
            # (a footer that does not read, a kill) before its commit leaves no table, not an empty one
            props = {**identity_properties(self.collection, self.pk, self.collection_id), **properties}
            tx = self._catalog.create_table_transaction(_identifier(self.collection), schema=pq.read_schema(paths[0]),
                                                        location=os.path.abspath(self.location), properties=props)
            tx.add_files(list(paths), snapshot_properties=dict(properties))
            tx.commit_transaction()
            self._tbl = self._catalog.load_table(_identifier(self.collection))
            return
        with self._table().transaction() as tx:
            tx.add_files(list(paths), snapshot_properties=dict(properties))
            tx.set_properties(dict(properties))

    def replace_files(self, paths: list[str], *, properties: dict[str, str]) -> None:
        """One transaction: every data and delete file removed, the Parquet files (a new snapshot) added,
        ``properties`` set."""
        from pyiceberg.table.snapshots import Operation

        check_prefix(properties)
        if not paths:
            raise MirrorError("replace_files needs at least one data file")
        tbl = self._table()
        tbl.refresh()
        snap = tbl.current_snapshot()
        old = {e.data_file.file_path for m in (snap.manifests(tbl.io) if snap is not None else [])
               for e in m.fetch_manifest_entry(tbl.io, discard_deleted=True)}
        with fenced(self.location, "the snapshot's replace"), tbl.transaction() as tx:
            if old:  # every data file and every position-delete file (which name only the old data files)
                commit_files(tx, tbl, adds=[], removes=old, operation=Operation.DELETE, what="the snapshot's replace",
                             properties=dict(properties))
            tx.add_files(list(paths), snapshot_properties=dict(properties))
            tx.set_properties(dict(properties))

    def evolve(self, new_schema: pa.Schema) -> None:
        add = schema_difference(self.location, self.collection, self.schema, new_schema)
        if add:
            self._add_columns(add)

    def _add_columns(self, fields: list[pa.Field]) -> None:
        tbl = self._table()
        with tbl.update_schema() as u:
            u.union_by_name(pa.schema([f.with_nullable(True) for f in fields]))

    def to_arrow(self) -> pa.Table:
        tbl = self._table()
        tbl.refresh()
        return tbl.scan().to_arrow()

