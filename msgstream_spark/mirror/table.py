"""One table per mirrored collection, in one of the registry's formats (``formats/registry.py``): opening it.

A table holds the collection's fields plus ``_ts`` and ``_seq`` of each row's last applied change (S for a
row as the snapshot read it) and its ``_partition``. Its properties name the collection (name, id, primary
key) so that a table is never fed another collection's changes, and every commit records the writing query
and its batch id so a re-run batch is skipped (exactly once). See docs/mirror.md.
"""

from __future__ import annotations

import pyarrow as pa

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.common import PROP_COLLECTION, PROP_PK, table_schema
from msgstream_spark.mirror.formats import registry
from msgstream_spark.mirror.formats.base import MirrorTable

__all__ = ["MirrorTable", "open_existing", "open_table", "table_schema"]


def open_table(fmt: str, location: str, *, collection: str, pk: str, arrow_schema: pa.Schema | None = None,
               catalog_uri: str | None = None, create: bool = True, collection_id: int | None = None,
               storage_options: dict | None = None, catalog: str | None = None,
               catalog_options: dict | None = None) -> MirrorTable:
    """The table at ``location`` (a local path or a URI: ``s3://``, ``gs://``, ``az://``, ``abfss://``,
    ``file://``), created from ``arrow_schema`` if missing and ``create``; ``fmt``: a name of
    ``formats.registry.names()``.

    ``arrow_schema``: the collection's fields (``table_schema`` adds the metadata columns). An existing
    table must belong to the same collection (name, primary key, id when both know it) and its columns
    must keep their types: otherwise MirrorError naming both, and nothing is written.
    ``storage_options``: the object store's settings (object_store keys, over the ``AWS_*`` / ``GOOGLE_*`` /
    ``AZURE_*`` environment; docs/mirror.md "Where the table lives"). ``catalog_uri``, ``catalog``,
    ``catalog_options``: the catalog of a format that has catalogs (``Format.catalogs``; ignored by the others).
    """
    return registry.open_table(fmt, location, collection=collection, pk=pk, arrow_schema=arrow_schema,
                               create=create, collection_id=collection_id, catalog_uri=catalog_uri,
                               storage_options=storage_options, catalog=catalog, catalog_options=catalog_options)


def open_existing(fmt: str, location: str, *, catalog_uri: str | None = None, storage_options: dict | None = None,
                  catalog: str | None = None, catalog_options: dict | None = None) -> MirrorTable:
    """The mirror table already at ``location``, its collection and key read from its own properties
    (maintenance: compaction, vacuum); MirrorError if there is none."""
    more = {"catalog_uri": catalog_uri, "storage_options": storage_options, "catalog": catalog,
            "catalog_options": catalog_options}
    props = registry.stored_properties(fmt, location, **more)
    if PROP_COLLECTION not in props or PROP_PK not in props:
        raise MirrorError(f"{location} is not a mirror table (no {PROP_COLLECTION} / {PROP_PK} property)")
    return open_table(fmt, location, collection=props[PROP_COLLECTION], pk=props[PROP_PK], create=False, **more)
