"""delta-rs (``deltalake``) opened on a location: the library imported lazily, a table's handle, whether a Delta
log is there. delta-rs's I/O errors (a listing or read refused: no bucket, no access, no server) come back as a
MirrorError naming the table's location, secrets masked."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from msgstream_spark.errors import MirrorError
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
