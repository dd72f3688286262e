"""A Delta mirror table read at one log version through delta-rs (``formats.base.Pinned``); nothing is collected:
batches stream from the files (through delta-rs's DataFusion scan when the table has deletion vectors)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa

SQL_KEYS = 10_000  # keys per filtered read of a table with deletion vectors


class DeltaPinned:
    """``table`` (a ``DeltaMirrorTable``) as of its current log version when created."""

    def __init__(self, table: Any) -> None:
        import deltalake

        self.table = table
        self._dt = deltalake.DeltaTable(table.root, storage_options=table.store.storage_options())
        self.version: Any = self._dt.version()
        info = self._dt.history(1)
        self.info = {k: str(v) for k, v in (info[0] if info else {}).items()}
        self.committed_ms: int | None = int(info[0]["timestamp"]) if info and "timestamp" in info[0] else None

    def last_batch(self, query_id: str) -> int | None:
        v = self._dt.transaction_version(query_id)
        return None if v is None else int(v)

    def rows_of(self, pk: str, keys: pa.Array, columns: list[str]) -> pa.Table:
        if len(keys) == 0:
            return pa.table({c: pa.array([], self.table.schema.field(c).type) for c in columns})
        if not self._has_dvs():
            import pyarrow.dataset as ds  # lazily: it loads pandas, ~0.4 s of every command's start

            return self._dt.to_pyarrow_dataset().to_table(columns=columns, filter=ds.field(pk).isin(keys))
        parts = [pa.Table.from_batches(list(self._sql(columns, pk, keys[i:i + SQL_KEYS])), schema=self._schema(columns))
                 for i in range(0, len(keys), SQL_KEYS)]
        return pa.concat_tables(parts)

    def batches(self, columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
        names = [f.name for f in self.table.schema]
        cols = [c for c in columns if c in names] if columns else None
        if self._has_dvs():  # delta-rs's pyarrow path refuses deletion vectors: its DataFusion scan
            yield from self._sql(cols or names)
            return
        yield from self._dt.to_pyarrow_dataset().to_batches(columns=cols)

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


def _ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _literal(v: Any) -> str:
    return str(int(v)) if isinstance(v, int) else "'" + str(v).replace("'", "''") + "'"
