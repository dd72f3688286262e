"""Rows appended to a plain Delta table of the mirror's own (not a mirror table): verify's report."""

from __future__ import annotations

from collections.abc import Mapping

import pyarrow as pa

from msgstream_spark.mirror.store import open_store, uri


def append_rows(location: str, rows: pa.Table, storage_options: Mapping[str, str] | None = None) -> None:
    """``rows`` appended to the Delta table at ``location`` (made by the first append), through delta-rs with the
    location's store settings (``storage_options`` over the environment's)."""
    import deltalake

    store = open_store(location, storage_options)
    deltalake.write_deltalake(uri.parse(location).uri(), rows, mode="append", storage_options=store.storage_options())
