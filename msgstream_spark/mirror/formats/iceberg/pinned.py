"""An Iceberg mirror table read at one snapshot through pyiceberg (``formats.base.Pinned``); nothing is
collected: batches stream from the files."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from msgstream_spark.mirror.formats.iceberg.table import PROP_BATCH_OF


class IcebergPinned:
    """``table`` (an ``IcebergMirrorTable``) as of its current snapshot when created (None: no snapshot)."""

    def __init__(self, table: Any) -> None:
        self.table = table
        tbl = table._table()  # the format's own handle, read-only here
        tbl.refresh()
        self._tbl = tbl
        snap = tbl.current_snapshot()
        self.version: Any = None if snap is None else snap.snapshot_id
        self.info = dict(snap.summary.additional_properties) if snap is not None else {}
        self._props = dict(tbl.properties)
        self.committed_ms: int | None = None if snap is None else int(snap.timestamp_ms)

    def last_batch(self, query_id: str) -> int | None:
        v = self._props.get(PROP_BATCH_OF + query_id)
        return None if v is None else int(v)

    def rows_of(self, pk: str, keys: pa.Array, columns: list[str]) -> pa.Table:
        if len(keys) == 0 or self.version is None:
            return pa.table({c: pa.array([], self.table.schema.field(c).type) for c in columns})
        from pyiceberg.expressions import In

        return self._tbl.scan(snapshot_id=self.version, row_filter=In(pk, keys.to_pylist()),
                              selected_fields=tuple(columns)).to_arrow()

    def batches(self, columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
        if self.version is None:
            return
        scan = self._tbl.scan(snapshot_id=self.version, selected_fields=tuple(columns) if columns else ("*",))
        yield from scan.to_arrow_batch_reader()
