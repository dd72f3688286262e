"""Which table format a location holds, from what each format writes there (no table library needed).

A Delta table keeps its log in ``<location>/_delta_log/``; an Iceberg table (pyiceberg's, Spark's, any
catalog's) its metadata files in ``<location>/metadata/*.metadata.json``. A location is a path or a URI the
table's store reads (``s3://``, ``gs://``, ``az://``, ``abfss://``, ``file://``), with its storage settings.
"""

from __future__ import annotations

from collections.abc import Mapping

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.store import StoreError, open_store, uri

DELTA_MARK = "_delta_log"
ICEBERG_MARK = "metadata"


def formats_at(location: str, storage_options: Mapping[str, str] | None = None) -> list[str]:
    """The formats whose files are at ``location`` (sorted; empty: no table there yet)."""
    store = open_store(location, storage_options)
    found = []
    try:
        if any(True for _ in store.list(uri.join(location, DELTA_MARK))):
            found.append("delta")
        if any(m.uri.endswith(".metadata.json") for m in store.list(uri.join(location, ICEBERG_MARK))):
            found.append("iceberg")
    except StoreError as exc:
        raise MirrorError(f"cannot read table location {location}: {exc}") from exc
    return found


def evidence(fmt: str) -> str:
    """What showed the format, for messages."""
    return {"delta": f"a {DELTA_MARK}/ directory", "iceberg": f"Iceberg {ICEBERG_MARK}/*.metadata.json files"}[fmt]
