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

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.collapse import OP
from msgstream_spark.mirror.common import (
    PROP_BATCH,
    PROP_PREFIX,
    PROP_QUERY,
    check_identity,
    check_prefix,
    conform,
    identity_properties,
    new_fields,
    schema_difference,
    table_schema,
)
from msgstream_spark.mirror.order import SEQ

NAMESPACE = "msgstream"
PROP_BATCH_OF = "msgstream.batch."
IN_FILTER_MAX = 2000


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

    def merge(self, collapsed: pa.Table, *, query_id: str, batch_id: int) -> bool:
        from pyiceberg.expressions import In

        done = self.last_batch(query_id)
        if done is not None and done >= batch_id:
            return False
        extra = new_fields(collapsed, self.schema)
        if extra:
            self._add_columns(extra)
        tbl = self._table()
        source = conform(collapsed, self.schema)
        remove, insert = self._plan(source, collapsed.column(OP))
        snap = {PROP_QUERY: query_id, PROP_BATCH: str(batch_id)}
        with tbl.transaction() as tx:
            if len(remove):
                tx.delete(In(self.pk, remove.to_pylist()), snapshot_properties=snap)
            if insert.num_rows:
                tx.append(insert, snapshot_properties=snap)
            tx.set_properties({PROP_BATCH_OF + query_id: str(int(batch_id))})
        return True

    def _plan(self, source: pa.Table, ops: pa.ChunkedArray) -> tuple[pa.Array, pa.Table]:
        """(pks to delete from the table, rows to append): a change applies only if newer than the table's row."""
        from pyiceberg.expressions import In

        tbl = self._table()
        keys = source.column(self.pk)
        if tbl.current_snapshot() is None:
            current = pa.table({self.pk: pa.array([], keys.type), SEQ: pa.array([], source.schema.field(SEQ).type)})
        elif len(keys) <= IN_FILTER_MAX:  # few keys: let pyiceberg prune files by the key's bounds
            current = tbl.scan(row_filter=In(self.pk, keys.to_pylist()), selected_fields=(self.pk, SEQ)).to_arrow()
        else:  # many keys: a huge In() costs more than reading two columns
            current = tbl.scan(selected_fields=(self.pk, SEQ)).to_arrow()
        # the scan's key type can differ from the batch's (a VarChar key read as string, the batch's large_string)
        current = pa.table({self.pk: current.column(self.pk).cast(keys.type), "__table_seq": current.column(SEQ)})
        joined = source.select([self.pk, SEQ]).append_column(OP, ops).join(current, self.pk, join_type="left outer")
        present = pc.is_valid(joined.column("__table_seq"))
        newer = pc.or_kleene(pc.invert(present), pc.greater(joined.column(SEQ), joined.column("__table_seq")))
        remove = pc.filter(joined.column(self.pk), pc.and_(present, newer)).combine_chunks()
        wanted = pc.filter(joined.column(self.pk), pc.and_(newer, pc.equal(joined.column(OP), "insert")))
        insert = source.filter(pc.is_in(keys, value_set=wanted.combine_chunks()))
        return remove, insert

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
        """One transaction: every row deleted, the Parquet files (a new snapshot) added, ``properties`` set."""
        from pyiceberg.expressions import AlwaysTrue

        check_prefix(properties)
        if not paths:
            raise MirrorError("replace_files needs at least one data file")
        tbl = self._table()
        tbl.refresh()
        with tbl.transaction() as tx:
            if tbl.current_snapshot() is not None:
                tx.delete(AlwaysTrue(), snapshot_properties=dict(properties))
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

