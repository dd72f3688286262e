"""The mirrored table as Delta Lake, through delta-rs (``deltalake``, no JVM).

Exactly once: every merge commits a Delta application transaction (app id = the query id, version =
the batch id) in the same commit as the data. delta-rs does not itself refuse a repeated
(app id, version) (delta-rs issues 2580, 3821), so ``merge`` reads ``transaction_version`` first and
skips a batch already in the table. One writer at a time.
"""

from __future__ import annotations

import pyarrow as pa

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
from msgstream_spark.mirror.deltalog import data_files, write_first_version, write_replace_version
from msgstream_spark.mirror.order import SEQ


def _deltalake():
    try:
        import deltalake
    except ImportError as e:
        raise MirrorError("the delta table format needs the 'deltalake' package: pip install "
                          "'msgstream-spark[mirror]'") from e
    return deltalake


def _q(name: str) -> str:
    return "`" + name.replace("`", "``") + "`"


class DeltaMirrorTable:
    """A Delta table at ``location`` mirroring one collection."""

    def __init__(self, location: str, collection: str, pk: str, collection_id: int | None) -> None:
        self.location = location
        self.collection = collection
        self.pk = pk
        self.collection_id = collection_id
        self._dt = None

    @classmethod
    def open(cls, location: str, *, collection: str, pk: str, arrow_schema: pa.Schema | None, create: bool,
             collection_id: int | None) -> DeltaMirrorTable:
        dl = _deltalake()
        t = cls(location, collection, pk, collection_id)
        if dl.DeltaTable.is_deltatable(location):
            t._dt = dl.DeltaTable(location)
            check_identity(location, t.properties(), collection, pk, collection_id)
            if arrow_schema is not None:
                t.evolve(table_schema(arrow_schema, pk))
        elif create:
            if arrow_schema is None:
                raise MirrorError(f"no Delta table at {location} and no schema to create it from")
            props = identity_properties(collection, pk, collection_id)
            t._dt = dl.DeltaTable.create(location, table_schema(arrow_schema, pk), configuration=props,
                                         name=collection, raise_if_key_not_exists=False)
        return t

    def _table(self):
        if self._dt is None:
            raise MirrorError(f"no Delta table at {self.location} (open it with create=True or add_files first)")
        return self._dt

    @property
    def schema(self) -> pa.Schema:
        return pa.schema(self._table().schema().to_arrow())

    def properties(self) -> dict[str, str]:
        conf = self._table().metadata().configuration
        return {k: v for k, v in conf.items() if k.startswith(PROP_PREFIX)}

    def set_properties(self, properties: dict[str, str]) -> None:
        check_prefix(properties)
        self._table().alter.set_table_properties(dict(properties), raise_if_not_exists=False)

    def last_batch(self, query_id: str) -> int | None:
        v = self._table().transaction_version(query_id)
        return None if v is None else int(v)

    def merge(self, collapsed: pa.Table, *, query_id: str, batch_id: int) -> bool:
        dl = _deltalake()
        dt = self._table()
        dt.update_incremental()
        done = self.last_batch(query_id)
        if done is not None and done >= batch_id:
            return False
        extra = new_fields(collapsed, self.schema)
        if extra:
            self._add_columns(extra)
        schema = self.schema
        source = conform(collapsed, schema).append_column(OP, collapsed.column(OP))
        cols = {_q(c): f"s.{_q(c)}" for c in schema.names}
        props = dl.CommitProperties(app_transactions=[dl.Transaction(query_id, int(batch_id))],
                                    custom_metadata={PROP_QUERY: query_id, PROP_BATCH: str(batch_id)})
        newer = f"s.{_q(SEQ)} > t.{_q(SEQ)}"
        (dt.merge(source, predicate=f"t.{_q(self.pk)} = s.{_q(self.pk)}", source_alias="s", target_alias="t",
                  commit_properties=props)
         .when_matched_delete(predicate=f"s.{OP} = 'delete' AND {newer}")
         .when_matched_update(updates=cols, predicate=f"s.{OP} = 'insert' AND {newer}")
         .when_not_matched_insert(updates=cols, predicate=f"s.{OP} = 'insert'")
         .execute())
        dt.update_incremental()
        if (self.last_batch(query_id) or -1) < batch_id:
            # delta-rs commits no version for a merge that changes nothing: record the batch id alone, so a
            # re-run of this batch is skipped and every batch leaves its id in the table
            dt.alter.set_table_properties({}, raise_if_not_exists=False, commit_properties=props)
        return True

    def merged_queries(self) -> set[str]:
        """The query ids whose batches were merged into the table (from the commits' info)."""
        return {str(h[PROP_QUERY]) for h in self._table().history() if h.get(PROP_QUERY)}

    def add_files(self, paths: list[str], *, properties: dict[str, str]) -> None:
        """The Parquet files (under ``location``) become the table's version 0, with ``properties``."""
        dl = _deltalake()
        if self._dt is not None:
            raise MirrorError(f"{self.location} is already a Delta table: add_files makes a new table's first version")
        check_prefix(properties)
        schema, adds = data_files(self.location, paths, self.pk)
        conf = {**identity_properties(self.collection, self.pk, self.collection_id), **properties}
        write_first_version(self.location, self.collection, dl.Schema.from_arrow(schema).to_json(), conf, adds)
        self._dt = dl.DeltaTable(self.location)

    def replace_files(self, paths: list[str], *, properties: dict[str, str]) -> None:
        """One commit: the table's rows become the Parquet files' (a new snapshot), with ``properties``."""
        dl = _deltalake()
        dt = self._table()
        dt.update_incremental()
        check_prefix(properties)
        schema, adds = data_files(self.location, paths, self.pk)
        md = dt.metadata()
        conf = {**md.configuration, **identity_properties(self.collection, self.pk, self.collection_id),
                **properties}
        meta = {"id": md.id, "name": md.name, "description": md.description,
                "format": {"provider": "parquet", "options": {}}, "partitionColumns": list(md.partition_columns),
                "configuration": conf, "createdTime": md.created_time}
        removes = [str(p) for p in dt.get_add_actions(flatten=True).column("path").to_pylist()]
        write_replace_version(self.location, dt.version() + 1, meta, dl.Schema.from_arrow(schema).to_json(),
                              removes, adds)
        self._dt = dl.DeltaTable(self.location)

    def evolve(self, new_schema: pa.Schema) -> None:
        add = schema_difference(self.location, self.collection, self.schema, new_schema)
        if add:
            self._add_columns(add)

    def _add_columns(self, fields: list[pa.Field]) -> None:
        dl = _deltalake()
        self._table().alter.add_columns([dl.Field.from_arrow(f.with_nullable(True)) for f in fields])

    def to_arrow(self) -> pa.Table:
        dt = self._table()
        dt.update_incremental()
        return pa.table(dt.to_pyarrow_table())

