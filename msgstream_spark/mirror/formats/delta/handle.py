"""delta-rs (``deltalake``) opened on a location: the library imported lazily, a table's handle, whether a Delta
log is there. delta-rs's I/O errors (a listing or read refused: no bucket, no access, no server) come back as a
MirrorError naming the table's location, secrets masked."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.common import PROP_PREFIX, conform
from msgstream_spark.mirror.store import mask

# storage options delta-rs reads for its own S3 log store (not object_store's keys): given to delta-rs only
LOG_STORE_KEYS = ("aws_s3_allow_unsafe_rename", "aws_s3_locking_provider", "delta_dynamo_table_name")


def deltalake() -> Any:
    """The ``deltalake`` module; MirrorError naming the extra to install if it is missing."""
    try:
        import deltalake
    except ImportError as e:
        raise MirrorError("the delta table format needs the 'deltalake' package: pip install "
                          "'msgstream-spark[mirror]'") from e
    return deltalake


def unreadable(location: str, what: str, e: OSError, options: Mapping[str, str]) -> MirrorError:
    """delta-rs's I/O error while ``what`` of the table at ``location``, naming the location."""
    return MirrorError(mask(f"cannot open the Delta table at {location}: {what} failed: {e}", dict(options)))


def table_at(location: str, root: str, options: Mapping[str, str]) -> Any:
    """delta-rs's handle of the table at ``root`` (``location`` as the user gave it) at its current version."""
    try:
        return deltalake().DeltaTable(root, storage_options=dict(options))
    except OSError as e:
        raise unreadable(location, "reading its log", e, options) from e


def is_table(location: str, root: str, options: Mapping[str, str]) -> bool:
    """Whether a Delta log is at ``root``; a listing that fails is a MirrorError naming ``location``."""
    try:
        return deltalake().DeltaTable.is_deltatable(root, storage_options=dict(options))
    except OSError as e:
        raise unreadable(location, "listing its log (_delta_log/)", e, options) from e


def stored_properties(location: str, root: str, options: Mapping[str, str]) -> dict[str, str]:
    """The ``msgstream.*`` properties of the Delta table at ``root``; MirrorError if there is none."""
    if not is_table(location, root, options):
        raise MirrorError(f"no Delta table at {location}")
    conf = table_at(location, root, options).metadata().configuration
    return {k: v for k, v in conf.items() if k.startswith(PROP_PREFIX)}


def scan(dt: Any, schema: Any, columns: list[str] | None = None) -> Any:
    """The rows of delta-rs's handle ``dt`` (its table's Arrow ``schema``) as plain delta-rs reads them (its
    DataFusion scan once deletion vectors are on); ``columns``: only these, projected in the scan."""
    if columns is not None:
        schema = pa.schema([schema.field(c) for c in columns])
    if "deletionVectors" in (dt.protocol().reader_features or []):
        what = "*" if columns is None else ", ".join(f'"{c}"' for c in columns)
        got = pa.table(deltalake().QueryBuilder().register("t", dt).execute(f"SELECT {what} FROM t").read_all())
        return conform(got, schema)  # DataFusion hands strings as string_view
    return pa.table(dt.to_pyarrow_table(columns=columns))
