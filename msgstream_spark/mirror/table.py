"""One table per mirrored collection, in Delta (delta-rs) or Iceberg (pyiceberg): the common interface.

A table holds the collection's fields plus ``_ts`` and ``_seq`` of each row's last applied change (S for a
row as the snapshot read it) and its ``_partition``. Its properties name the collection (name, id, primary
key) so that a table is never fed another collection's changes, and every commit records the writing query
and its batch id so a re-run batch is skipped (exactly once). See docs/mirror.md.
"""

from __future__ import annotations

from typing import Protocol, runtime_checkable

import pyarrow as pa

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.common import PROP_COLLECTION, PROP_PK, table_schema
from msgstream_spark.mirror.formats.delta.table import DeltaMirrorTable
from msgstream_spark.mirror.formats.iceberg.table import IcebergMirrorTable

FORMATS = ("delta", "iceberg")
__all__ = ["FORMATS", "MirrorTable", "open_existing", "open_table", "table_schema"]


@runtime_checkable
class MirrorTable(Protocol):
    """A mirrored collection's table (one writer at a time)."""

    location: str
    collection: str
    pk: str

    @property
    def schema(self) -> pa.Schema: ...

    def last_batch(self, query_id: str) -> int | None:
        """The largest batch id of ``query_id`` committed to the table (None: none)."""

    def merged_queries(self) -> set[str]:
        """The ids of the queries that merged batches into the table."""

    def merge(self, collapsed: pa.Table, *, query_id: str, batch_id: int,
              commit_info: dict[str, str] | None = None) -> bool:
        """Apply one change per pk (``collapse``'s output); False if the batch is already in the table.
        ``commit_info``: ``msgstream.*`` entries recorded with the commit (the batch's watermark)."""

    def add_files(self, paths: list[str], *, properties: dict[str, str]) -> None:
        """Register Parquet files written elsewhere (a snapshot) as the table's rows, with ``properties``."""

    def replace_files(self, paths: list[str], *, properties: dict[str, str]) -> None:
        """Replace all the table's rows by the Parquet files' (a new snapshot), with ``properties``, in one
        commit: a failure before it leaves the table as it was."""

    def properties(self) -> dict[str, str]:
        """The table's ``msgstream.*`` properties (collection identity, job metadata)."""

    def set_properties(self, properties: dict[str, str]) -> None:
        """Store ``msgstream.*`` properties (one commit)."""

    def evolve(self, new_schema: pa.Schema) -> None:
        """Add the columns of ``new_schema`` the table lacks, as nullable columns."""

    def to_arrow(self) -> pa.Table: ...


def _catalog_args(storage_options, catalog, catalog_options) -> dict:
    """The Iceberg table's store and catalog arguments that were given (an Iceberg module without them keeps
    its defaults)."""
    got = {"storage_options": storage_options, "catalog": catalog, "catalog_options": catalog_options}
    return {k: v for k, v in got.items() if v is not None}


def open_table(fmt: str, location: str, *, collection: str, pk: str, arrow_schema: pa.Schema | None = None,
               catalog_uri: str | None = None, create: bool = True, collection_id: int | None = None,
               storage_options: dict | None = None, catalog: str | None = None,
               catalog_options: dict | None = None) -> MirrorTable:
    """The table at ``location`` (a local path or a URI: ``s3://``, ``gs://``, ``az://``, ``abfss://``,
    ``file://``), created from ``arrow_schema`` if missing and ``create``.

    ``arrow_schema``: the collection's fields (``table_schema`` adds the metadata columns). An existing
    table must belong to the same collection (name, primary key, id when both know it) and its columns
    must keep their types: otherwise MirrorError naming both, and nothing is written.
    ``storage_options``: the object store's settings (object_store keys, over the ``AWS_*`` / ``GOOGLE_*`` /
    ``AZURE_*`` environment; docs/mirror.md "Where the table lives"). ``catalog``, ``catalog_options``: the
    Iceberg catalog (a Delta table has none).
    """
    if fmt == "delta":
        return DeltaMirrorTable.open(location, collection=collection, pk=pk, arrow_schema=arrow_schema,
                                     create=create, collection_id=collection_id, storage_options=storage_options)
    if fmt == "iceberg":
        return IcebergMirrorTable.open(location, collection=collection, pk=pk, arrow_schema=arrow_schema,
                                       catalog_uri=catalog_uri, create=create, collection_id=collection_id,
                                       **_catalog_args(storage_options, catalog, catalog_options))
    raise MirrorError(f"table format must be one of {FORMATS}, got {fmt!r}")


def open_existing(fmt: str, location: str, *, catalog_uri: str | None = None, storage_options: dict | None = None,
                  catalog: str | None = None, catalog_options: dict | None = None) -> MirrorTable:
    """The mirror table already at ``location``, its collection and key read from its own properties
    (maintenance: compaction, vacuum); MirrorError if there is none."""
    more = _catalog_args(storage_options, catalog, catalog_options)
    if fmt == "delta":
        props = DeltaMirrorTable.stored_properties(location, storage_options)
    elif fmt == "iceberg":
        props = IcebergMirrorTable.stored_properties(location, catalog_uri, **more)
    else:
        raise MirrorError(f"table format must be one of {FORMATS}, got {fmt!r}")
    if PROP_COLLECTION not in props or PROP_PK not in props:
        raise MirrorError(f"{location} is not a mirror table (no {PROP_COLLECTION} / {PROP_PK} property)")
    return open_table(fmt, location, collection=props[PROP_COLLECTION], pk=props[PROP_PK], catalog_uri=catalog_uri,
                      create=False, **more)
