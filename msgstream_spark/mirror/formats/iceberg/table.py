"""The mirrored table as Apache Iceberg, through ``pyiceberg`` and a catalog (no JVM).

The catalog (``catalog.py``): by default a SQLite file (``catalog_uri``, a SQLAlchemy URL; default
``<location>_catalog.sqlite``, next to a local table, where Iceberg's orphan-file removal does not reach; a table
of an earlier release keeps its ``<location>/catalog.sqlite``), created only when a table is: meant for
development and one writer; or a catalog you run (``--catalog NAME``: SQL on PostgreSQL, REST, ...), which is
what a table in object storage needs. Every file the mirror reads or writes goes through the table's store
(``table.store``); pyiceberg writes its metadata files, manifest lists and manifests through its FileIO, given
the same storage settings. Manifests and position-delete files name every file by a full URI.
Exactly once: each batch's commit is one Iceberg transaction (its data and position-delete files and the table property
``msgstream.batch.<query id>`` = batch id), whose snapshots carry the query id and batch id in their summary;
a batch whose id is not above the stored one is skipped; the transaction is fenced at the snapshot its plan read
(``commit.py``), so a concurrent writer's commit refuses it in the catalog.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.common import (
    PROP_BATCH,
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
from msgstream_spark.mirror.formats.base import (
    DATA_DIR,
    NO_SNAPSHOT,
    LiveFile,
    LiveFiles,
    Plan,
    WriteSpec,
    fence_message,
)
from msgstream_spark.mirror.formats.iceberg.cached import arrow_schema, manifests, transaction
from msgstream_spark.mirror.formats.iceberg.catalog import _identifier, locate
from msgstream_spark.mirror.formats.iceberg.commit import (
    assert_head,
    commit_epoch,
    commit_files,
    fenced,
    head_id,
    table_epoch,
)
from msgstream_spark.mirror.formats.iceberg.expiry import (
    metadata_dir_files,
    metadata_json_files,
    snapshot_files,
    split_snapshots,
)
from msgstream_spark.mirror.formats.iceberg.files import (
    data_file,
    file_schema,
    store_path,
    write_position_deletes,
)
from msgstream_spark.mirror.formats.iceberg.handle import CatalogTable
from msgstream_spark.mirror.formats.iceberg.manifest_read import manifest_entries
from msgstream_spark.mirror.store import uri
from msgstream_spark.mirror.store.parquet import keep_footer

PROP_BATCH_OF = "msgstream.batch."


class IcebergMirrorTable(CatalogTable):
    """An Iceberg table mirroring one collection: at ``location`` (a path or URI), or named by identifier in a
    named catalog (``location`` is then the catalog's, once the table exists)."""

    @classmethod
    def open(cls, location: str, *, collection: str, pk: str, arrow_schema: pa.Schema | None = None,
             catalog_uri: str | None = None, create: bool = True, collection_id: int | None = None,
             storage_options: Mapping[str, Any] | None = None, catalog: str | None = None,
             catalog_options: Mapping[str, str] | None = None) -> IcebergMirrorTable:
        """The table (created from ``arrow_schema`` if missing and ``create``; a table named by identifier is
        created as soon as a schema is given: the catalog chooses its location, where the snapshot's files go)."""
        where = locate(location, catalog=catalog, catalog_options=catalog_options, catalog_uri=catalog_uri,
                       storage_options=storage_options, create=create)
        t = cls(location, collection, pk, collection_id, where, storage_options, catalog_uri)
        if t._catalog is None:
            t._check_free()  # (another catalog's table there: refused before a snapshot is read for add_files)
            return t  # no catalog file yet, none made before a table is: add_files makes both
        t._tbl = t._find()
        ident = where.ident or _identifier(collection)
        if t._tbl is None and where.ident is None and t._catalog.table_exists(ident):
            raise MirrorError(f"the catalog already has a table {'.'.join(ident)} for {collection!r}, at "
                              f"{t._catalog.load_table(ident).location()}, not at {location}")
        if t._tbl is None:
            t._check_free()
        if t._tbl is not None:
            check_identity(t.location, t.properties(), collection, pk, collection_id)
            if arrow_schema is not None:
                t.evolve(table_schema(arrow_schema, pk))
        elif create or (arrow_schema is not None and where.create_at is None):
            if arrow_schema is None:
                raise MirrorError(f"no Iceberg table {'.'.join(ident)} at {location} and no schema to create it from")
            t._create(table_schema(arrow_schema, pk), {})
        return t

    @staticmethod
    def stored_properties(location: str, catalog_uri: str | None = None, *,
                          storage_options: Mapping[str, Any] | None = None, catalog: str | None = None,
                          catalog_options: Mapping[str, str] | None = None) -> dict[str, str]:
        """The ``msgstream.*`` properties of the catalog's table at ``location`` (or named ``location``);
        MirrorError if there is none."""
        where = locate(location, catalog=catalog, catalog_options=catalog_options, catalog_uri=catalog_uri,
                       storage_options=storage_options, create=False)
        t = IcebergMirrorTable(location, "", "", None, where, storage_options, catalog_uri)
        tbl = t._find() if t._catalog is not None else None
        if tbl is None:
            raise MirrorError(f"no Iceberg table {location} in {where.name} catalog")
        return {k: v for k, v in tbl.properties.items() if k.startswith(PROP_PREFIX)}

    @property
    def schema(self) -> pa.Schema:
        return arrow_schema(self._table().schema())

    def properties(self) -> dict[str, str]:
        tbl = self._fresh()
        return {k: v for k, v in tbl.properties.items() if k.startswith(PROP_PREFIX)}

    def set_properties(self, properties: dict[str, str]) -> None:
        check_prefix(properties)
        with fenced(self.location, "setting properties"), transaction(self._table()) as tx:
            tx.set_properties(dict(properties))

    def last_batch(self, query_id: str) -> int | None:
        v = self.properties().get(PROP_BATCH_OF + query_id)
        return None if v is None else int(v)

    def merged_queries(self) -> set[str]:
        """The query ids whose batches were merged into the table (its ``msgstream.batch.<query id>`` properties)."""
        return {k.removeprefix(PROP_BATCH_OF) for k in self.properties() if k.startswith(PROP_BATCH_OF)}

    def prepare(self, columns: pa.Schema) -> None:
        """Add the collection fields ``columns`` carry that the table lacks (before tasks write files)."""
        extra = new_fields(columns.empty_table(), self.schema)
        if extra:
            self._add_columns(extra)

    def write_spec(self) -> WriteSpec:
        tbl = self._fresh()
        snap = tbl.properties.get(PROP_SNAPSHOT_TS)
        schema = arrow_schema(tbl.schema())
        split = [tbl.schema().find_column_name(f.source_id) for f in tbl.spec().fields]
        if any(str(f.transform) != "identity" for f in tbl.spec().fields):
            raise MirrorError(f"table {self.location} is partitioned by {tbl.spec()}: the mirror writes tables "
                              "unpartitioned or with identity partitions only")
        return WriteSpec(schema, self.pk, uri.join(self.root, DATA_DIR), None if snap is None else int(snap),
                         self.schema.field(self.pk).type, split, storage=dict(self.store.options), footers=True)

    def warm(self) -> None:
        """Its manifests and position deletes read ahead into this object's caches (a restarted job, while Spark
        starts its query): its first batch's live files then read only what is new."""
        self.live_files()

    def live_files(self) -> LiveFiles:
        """The live data files with key bounds and deleted positions, from the current snapshot's manifests
        (whose id they carry); each file's location in the store's spelling, with its size.
        A manifest never changes, so its entries are read once (pyiceberg's ``plan_files`` reads every
        manifest again at each call: a cost growing with the table's commits); position deletes are matched
        to data files by path, which is what a position delete names."""
        return self._live_of(self._fresh())

    def known_files(self) -> LiveFiles:
        """The live files as this writer's last read of the catalog and its commits left them (no catalog read:
        the maintenance check after a batch's commit; the manifests the commit wrote are known, none is read)."""
        return self._live_of(self._table())

    def _live_of(self, tbl) -> LiveFiles:
        from pyiceberg.conversions import from_bytes
        from pyiceberg.manifest import DataFileContent, ManifestContent

        snap = tbl.current_snapshot()
        if snap is None:
            return LiveFiles([], NO_SNAPSHOT)
        field = tbl.schema().find_field(self.pk)
        data, deletes, entries = [], [], {}
        for m in manifests(snap, tbl.io):
            got = entries[m.manifest_path] = (self._entries.get(m.manifest_path)
                                              or [e.data_file for e in manifest_entries(m, tbl.io)])
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
        out, self._names = [], {}
        for f in data:
            lo, hi = f.lower_bounds.get(field.field_id), f.upper_bounds.get(field.field_id)
            gone = deleted.get(f.file_path)
            live = LiveFile(store_path(self.store, f.file_path),
                            None if lo is None else from_bytes(field.field_type, lo),
                            None if hi is None else from_bytes(field.field_type, hi),
                            np.unique(np.concatenate(gone)).astype(np.uint64) if gone else
                            np.zeros(0, np.uint64), f.record_count, f.partition, f.file_size_in_bytes)
            self._names[live.path] = f.file_path
            out.append(live)
        self._live = out
        used = {d.file_path for d in deletes}
        self._deletes = {k: v for k, v in self._deletes.items() if k in used}  # expired delete files: forgotten
        return LiveFiles(out, snap.snapshot_id)

    def writer_epoch(self) -> int:
        """The epoch of the newest writer that published one (``store/writer.py``; 0: none)."""
        tbl = self._fresh()
        return table_epoch(tbl.metadata)

    def publish_epoch(self, epoch: int) -> None:
        """Make ``epoch`` the table's writer epoch (a snapshot of its own); LeaseLost if it has a higher one."""
        commit_epoch(self._table(), epoch, self.location)

    def commit(self, plan: Plan, *, query_id: str, batch_id: int, commit_info: dict[str, str] | None = None,
               epoch: int | None = None) -> bool:
        """One Iceberg snapshot: the new data files, one position-delete file, the batch's id in the properties.
        Fenced: based on the snapshot the plan's lookup read (``plan.base``), refused if the table moved, or if
        it holds a writer epoch above ``epoch`` (whose snapshot moved it: the catalog refuses the commit then)."""
        self._looked = False  # the commit checks the table as the catalog has it now (in a batch too)
        done = self.last_batch(query_id)
        if done is not None and done >= batch_id:
            return False
        tbl = self._table()
        what = f"batch {batch_id} of query {query_id}"
        check_epoch(self.location, table_epoch(tbl.metadata), epoch, what)
        if plan.base is not None and head_id(tbl.metadata) != plan.base:
            raise MirrorError(fence_message(self.location, "snapshot", plan.base, head_id(tbl.metadata), what))
        for p in plan.adds:  # the footers the writing tasks shipped: no data file is read back for its statistics
            if plan.footers.get(p) and p in plan.info:
                keep_footer(p, plan.info[p][0], plan.footers[p])
        adds = [data_file(self._store_for(p), tbl.metadata, p, plan.info.get(p, (0, ""))[0]) for p in plan.adds]
        if plan.deletes:  # one position-delete file per partition of the data files it names
            part = {f.path: f.partition for f in self._live}
            part.update({p: d.partition for p, d in zip(plan.adds, adds)})
            groups: dict = {}
            for path, pos in plan.deletes.items():
                groups.setdefault(part[path], {})[self._named(path)] = pos
            for record, deletes in groups.items():
                adds.append(write_position_deletes(self.store, uri.join(self.root, DATA_DIR), deletes,
                                                   tbl.metadata.default_spec_id, record))
                self._deletes[adds[-1].file_path] = {k: np.asarray(v, np.int64) for k, v in deletes.items()}
        fresh: dict[str, list] = {}
        with fenced(self.location, what), transaction(tbl) as tx:
            if plan.base is not None:  # the catalog refuses the commit if another writer's landed meanwhile
                assert_head(tx, plan.base)
            if adds:
                fresh = commit_files(tx, tbl, adds=adds, removes=set(), base=plan.base, what=what,
                                     location=self.location, properties={**(commit_info or {}), PROP_QUERY: query_id,
                                                                         PROP_BATCH: str(batch_id)})
            tx.set_properties({PROP_BATCH_OF + query_id: str(int(batch_id))})
        self._entries.update(fresh)  # the manifests it wrote: their entries known, never read back
        return True

    def swap_files(self, old: list[LiveFile], new: list[str], base: int | None = None,
                   epoch: int | None = None) -> None:
        """One ``replace`` snapshot (a compaction): the ``old`` data files and every position-delete file removed
        (each names only files with deletes, which a compaction always takes), the ``new`` files added.
        ``base``: the snapshot ``old`` was read at (refused if the table moved since); ``epoch``: the writer's."""
        from pyiceberg.table.snapshots import Operation

        tbl = self._table()
        tbl.refresh()
        check_epoch(self.location, table_epoch(tbl.metadata), epoch, "the compaction")
        if base is not None and head_id(tbl.metadata) != base:
            raise MirrorError(fence_message(self.location, "snapshot", base, head_id(tbl.metadata), "the compaction"))
        want = {f.path for f in old}
        removes: set[str] = set()
        for task in tbl.scan().plan_files():
            if store_path(self.store, task.file.file_path) in want:
                removes.add(task.file.file_path)
            removes.update(d.file_path for d in task.delete_files)
        missing = want - {store_path(self.store, p) for p in removes}
        if missing:
            raise MirrorError(f"{sorted(missing)[:3]} are no longer in table {self.location}: another writer changed "
                              "it; nothing compacted")
        with fenced(self.location, "the compaction"), transaction(tbl) as tx:
            commit_files(tx, tbl, adds=[data_file(self._store_for(p), tbl.metadata, p) for p in new], removes=removes,
                         base=base, operation=Operation.REPLACE, what="the compaction", location=self.location,
                         properties={"msgstream.operation": "compaction"})

    def referenced_files(self) -> set[str]:
        """The data and delete files any snapshot the table keeps references, with the manifests and manifest
        lists (in the store's spelling)."""
        tbl = self._table()
        tbl.refresh()
        return snapshot_files(self.store, tbl, tbl.snapshots(), self._entries)

    def retained_files(self, retain_s: float, now: float) -> set[str]:
        """Every file a snapshot current at some moment within ``retain_s`` of ``now`` reads (``expiry``), and
        the metadata files the table keeps."""
        tbl = self._table()
        tbl.refresh()
        kept, _ = split_snapshots(tbl.metadata, int((now - retain_s) * 1000))
        return snapshot_files(self.store, tbl, kept, self._entries) | metadata_json_files(self.store, tbl)

    def expire(self, retain_s: float, now: float) -> None:
        """Expire (one commit) the snapshots not current at any moment within ``retain_s`` of ``now``: those
        ``retained_files`` leaves out (before and after this commit alike)."""
        tbl = self._table()
        tbl.refresh()
        _, expired = split_snapshots(tbl.metadata, int((now - retain_s) * 1000))
        if expired:
            with fenced(self.location, f"expiring {len(expired)} snapshot(s) (vacuum: nothing deleted)"):
                tbl.maintenance.expire_snapshots().by_ids([s.snapshot_id for s in expired]).commit()

    def metadata_files(self) -> list[str]:
        """The metadata files, manifest lists and manifests in the store (what vacuum may delete of them)."""
        tbl = self._table()
        tbl.refresh()
        return metadata_dir_files(self.store, tbl)

    def add_files(self, paths: list[str], *, properties: dict[str, str]) -> None:
        """Register the Parquet files (written elsewhere, e.g. by Spark tasks; full URIs or absolute paths) with
        ``properties``."""
        check_prefix(properties)
        if not paths:
            raise MirrorError("add_files needs at least one data file")
        schema = file_schema(self._store_for(paths[0]), paths[0]) if self._tbl is None else None
        if self._tbl is None and self._where.create_at is None:  # a catalog that places the table itself: made
            self._create(schema, {})  # first (REST catalogs need not implement staged creation; lakana does not)
        if self._tbl is None:  # one transaction creates the table with its files and properties: a failure
            # (a footer that does not read, a kill) before its commit leaves no table, not an empty one
            ident = self._creating()
            props = {**identity_properties(self.collection, self.pk, self.collection_id), **properties}
            tx = self._catalog.create_table_transaction(ident, schema=schema, properties=props,
                                                        location=self._where.create_at)
            self._append(tx, tx._table, paths, properties)
            with fenced(self.location, "the table's creation"):
                tx.commit_transaction()
            self._tbl = self._find()
            return
        tbl = self._table()
        with fenced(self.location, "adding files"), transaction(tbl) as tx:
            self._append(tx, tbl, paths, properties)
            tx.set_properties(dict(properties))

    def _append(self, tx, tbl, paths: list[str], properties: dict[str, str]) -> None:
        """An append snapshot of the Parquet files at ``paths`` in ``tx`` (their entries read through the store;
        files without field ids read by the table's name mapping, which is set if the table has none)."""
        from pyiceberg.table import TableProperties

        if tx.table_metadata.name_mapping() is None:
            tx.set_properties(**{TableProperties.DEFAULT_NAME_MAPPING:
                                 tx.table_metadata.schema().name_mapping.model_dump_json()})
        commit_files(tx, tbl, adds=[data_file(self._store_for(p), tx.table_metadata, p) for p in paths], removes=set(),
                     properties=dict(properties), what="adding files", location=self.location)

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
        old = {e.data_file.file_path for m in (manifests(snap, tbl.io) if snap is not None else ())
               for e in manifest_entries(m, tbl.io)}
        with fenced(self.location, "the snapshot's replace"), transaction(tbl) as tx:
            if old:  # every data file and every position-delete file (which name only the old data files)
                commit_files(tx, tbl, adds=[], removes=old, operation=Operation.DELETE, what="the snapshot's replace",
                             properties=dict(properties), location=self.location)
            self._append(tx, tbl, paths, properties)
            tx.set_properties(dict(properties))

    def evolve(self, new_schema: pa.Schema) -> None:
        add = schema_difference(self.location, self.collection, self.schema, new_schema)
        if add:
            self._add_columns(add)

    def _add_columns(self, fields: list[pa.Field]) -> None:
        tbl = self._table()
        with fenced(self.location, "adding columns"), tbl.update_schema() as u:
            u.union_by_name(pa.schema([f.with_nullable(True) for f in fields]))

    def to_arrow(self, columns: list[str] | None = None) -> pa.Table:
        tbl = self._table()
        tbl.refresh()
        return (tbl.scan() if columns is None else tbl.scan(selected_fields=tuple(columns))).to_arrow()

