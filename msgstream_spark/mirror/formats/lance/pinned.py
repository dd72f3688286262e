"""A Lance mirror table read at one version (``formats.base.Pinned``); batches stream from the fragments."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from msgstream_spark.mirror.formats.lance import records as rec


class LancePinned:
    """``table`` (a ``LanceMirrorTable``) as of its newest version when created."""

    def __init__(self, table: Any) -> None:
        self.table = table
        self._ds = table._table()
        self.version: Any = self._ds.version
        tx = self._ds.read_transaction(self.version)
        props = dict(tx.transaction_properties or {}) if tx is not None else {}
        self.info = {k: v for k, v in props.items() if k.startswith("msgstream.") and not rec.is_record(k)
                     and k != rec.RECORDS}
        self._records = rec.read_records(self._ds)
        ts = self._ds.versions()[-1]["timestamp"] if self.version else None
        self.committed_ms: int | None = None if ts is None else int(ts.timestamp() * 1000)

    def last_batch(self, query_id: str) -> int | None:
        return rec.last_batch(self._records, query_id)

    def rows_of(self, pk: str, keys: pa.Array, columns: list[str]) -> pa.Table:
        if len(keys) == 0:
            return pa.table({c: pa.array([], self._ds.schema.field(c).type) for c in columns})
        return self._ds.to_table(columns=columns, filter=pc.field(pk).isin(keys))

    def batches(self, columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
        names = self._ds.schema.names
        cols = [c for c in columns if c in names] if columns else None
        yield from self._ds.to_batches(columns=cols)
