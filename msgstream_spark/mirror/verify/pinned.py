"""A mirrored table read at one of its versions: its rows as record batches, its last batch and the
watermark recorded with that commit. Delta through delta-rs (a version), Iceberg through pyiceberg (a
snapshot id); nothing is collected: batches stream from the files."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.common import PROP_BATCH, PROP_COLLECTION, PROP_PK, PROP_QUERY
from msgstream_spark.mirror.formats.delta.table import DeltaMirrorTable
from msgstream_spark.mirror.formats.iceberg.table import PROP_BATCH_OF, IcebergMirrorTable
from msgstream_spark.mirror.watermark import PROP_WATERMARK


class PinnedTable:
    """``table`` as of its current version when created (later commits are not seen)."""

    def __init__(self, table: Any) -> None:
        self.table = table
        if isinstance(table, DeltaMirrorTable):
            import deltalake

            self._dt = deltalake.DeltaTable(table.root, storage_options=table.store.storage_options())
            self.version: Any = self._dt.version()
            info = self._dt.history(1)
            self._info = {k: str(v) for k, v in (info[0] if info else {}).items()}
            self.committed_ms: int | None = int(info[0]["timestamp"]) if info and "timestamp" in info[0] else None
            self.fmt = "delta"
        elif isinstance(table, IcebergMirrorTable):
            tbl = table._table()  # the format's own handle, read-only here
            tbl.refresh()
            self._tbl = tbl
            snap = tbl.current_snapshot()
            self.version = None if snap is None else snap.snapshot_id
            self._info = dict(snap.summary.additional_properties) if snap is not None else {}
            self._props = dict(tbl.properties)
            self.committed_ms = None if snap is None else int(snap.timestamp_ms)
            self.fmt = "iceberg"
        else:
            raise MirrorError(f"cannot pin a table of type {type(table).__name__}")

    def last_batch(self, query_id: str) -> int | None:
        if self.fmt == "delta":
            v = self._dt.transaction_version(query_id)
            return None if v is None else int(v)
        v = self._props.get(PROP_BATCH_OF + query_id)
        return None if v is None else int(v)

    @property
    def committed_by(self) -> tuple[str | None, int | None]:
        """(query id, batch id) of the version's own commit (None, None: not a mirror merge)."""
        q, b = self._info.get(PROP_QUERY), self._info.get(PROP_BATCH)
        return q, (int(b) if b is not None else None)

    @property
    def recorded_watermark(self) -> str | None:
        """The ``msgstream.watermark`` this version's commit recorded (None: an older commit)."""
        return self._info.get(PROP_WATERMARK)

    def rows_of(self, pk: str, keys: pa.Array, columns: list[str]) -> pa.Table:
        """The table's ``columns`` of the rows of ``keys`` at this version (a filtered read)."""
        if len(keys) == 0 or (self.fmt == "iceberg" and self.version is None):
            return pa.table({c: pa.array([], self.table.schema.field(c).type) for c in columns})
        if self.fmt == "delta":
            if not self._has_dvs():
                import pyarrow.dataset as ds  # lazily: it loads pandas, ~0.4 s of every command's start

                return self._dt.to_pyarrow_dataset().to_table(columns=columns, filter=ds.field(pk).isin(keys))
            parts = [pa.Table.from_batches(list(self._sql(columns, pk, keys[i:i + SQL_KEYS])),
                                           schema=self._schema(columns))
                     for i in range(0, len(keys), SQL_KEYS)]
            return pa.concat_tables(parts)
        from pyiceberg.expressions import In

        return self._tbl.scan(snapshot_id=self.version, row_filter=In(pk, keys.to_pylist()),
                              selected_fields=tuple(columns)).to_arrow()

    def batches(self, columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
        if self.fmt == "delta":
            names = [f.name for f in self.table.schema]
            cols = [c for c in columns if c in names] if columns else None
            if self._has_dvs():  # delta-rs's pyarrow path refuses deletion vectors: its DataFusion scan
                yield from self._sql(cols or names)
                return
            yield from self._dt.to_pyarrow_dataset().to_batches(columns=cols)
            return
        if self.version is None:
            return
        scan = self._tbl.scan(snapshot_id=self.version,
                              selected_fields=tuple(columns) if columns else ("*",))
        yield from scan.to_arrow_batch_reader()


    def _has_dvs(self) -> bool:
        return "deletionVectors" in (self._dt.protocol().reader_features or [])

    def _schema(self, columns: list[str]) -> pa.Schema:
        return pa.schema([self.table.schema.field(c) for c in columns])

    def _sql(self, columns: list[str], pk: str | None = None, keys: pa.Array | None = None) -> Iterator[pa.RecordBatch]:
        """Rows of this version through delta-rs's DataFusion scan (deletion vectors applied), as the table's
        types (DataFusion hands strings as views); ``keys``: only the rows of these keys of column ``pk``."""
        import deltalake

        sql = f"SELECT {', '.join(_ident(c) for c in columns)} FROM t"
        if keys is not None:
            sql += f" WHERE {_ident(pk)} IN ({', '.join(_literal(k) for k in keys.to_pylist())})"
        schema = self._schema(columns)
        for b in deltalake.QueryBuilder().register("t", self._dt).execute(sql):
            yield pa.RecordBatch.from_arrays([b.column(i).cast(f.type) for i, f in enumerate(schema)], schema=schema)


SQL_KEYS = 10_000  # keys per filtered read of a table with deletion vectors


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(v: Any) -> str:
    return str(int(v)) if isinstance(v, int) else "'" + str(v).replace("'", "''") + "'"


def table_identity(fmt: str, location: str, catalog_uri: str | None = None, storage_options: dict | None = None,
                   catalog: str | None = None, catalog_options: dict | None = None) -> tuple[str, str]:
    """(collection, primary key) a mirrored table's properties name; MirrorError if it has none."""
    if fmt == "delta":
        props = DeltaMirrorTable.stored_properties(location, storage_options)
    else:
        props = IcebergMirrorTable.stored_properties(location, catalog_uri, storage_options=storage_options,
                                                     catalog=catalog, catalog_options=catalog_options)
    if not props.get(PROP_COLLECTION) or not props.get(PROP_PK):
        raise MirrorError(f"table {location} names no mirrored collection ({PROP_COLLECTION}, {PROP_PK})")
    return props[PROP_COLLECTION], props[PROP_PK]
