"""A mirrored table read at one of its versions: its rows as record batches, its last batch and the
watermark recorded with that commit. Each format pins its own version (``formats.registry.pin``: Delta a log
version, Iceberg a snapshot id); nothing is collected: batches stream from the files."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.common import PROP_BATCH, PROP_COLLECTION, PROP_PK, PROP_QUERY
from msgstream_spark.mirror.formats import registry
from msgstream_spark.mirror.watermark import PROP_WATERMARK


class PinnedTable:
    """``table`` as of its current version when created (later commits are not seen)."""

    def __init__(self, table: Any) -> None:
        self.table = table
        self._pin = registry.pin(table)
        self.version: Any = self._pin.version
        self.committed_ms: int | None = self._pin.committed_ms
        self._info = self._pin.info
        self.fmt = registry.of(table).name

    def last_batch(self, query_id: str) -> int | None:
        return self._pin.last_batch(query_id)

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
        return self._pin.rows_of(pk, keys, columns)

    def batches(self, columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
        yield from self._pin.batches(columns)


def table_identity(fmt: str, location: str, catalog_uri: str | None = None, storage_options: dict | None = None,
                   catalog: str | None = None, catalog_options: dict | None = None) -> tuple[str, str]:
    """(collection, primary key) a mirrored table's properties name; MirrorError if it has none."""
    props = registry.stored_properties(fmt, location, catalog_uri=catalog_uri, storage_options=storage_options,
                                       catalog=catalog, catalog_options=catalog_options)
    if not props.get(PROP_COLLECTION) or not props.get(PROP_PK):
        raise MirrorError(f"table {location} names no mirrored collection ({PROP_COLLECTION}, {PROP_PK})")
    return props[PROP_COLLECTION], props[PROP_PK]
