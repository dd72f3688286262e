"""Which table format a location holds, from what each format writes there (no table library needed).

A Delta table keeps its log in ``<location>/_delta_log/``; an Iceberg table (pyiceberg's, Spark's, any
catalog's) its metadata files in ``<location>/metadata/*.metadata.json``. A location is a path or a URI
that pyarrow's file systems read (``s3://``, ``gs://``, ``abfs://``, ``file://``).
"""

from __future__ import annotations

import os

from pyarrow import fs as pafs

from msgstream_spark.errors import MirrorError

DELTA_MARK = "_delta_log"
ICEBERG_MARK = "metadata"


def _filesystem(location: str):
    """(file system, path) of ``location``; a plain path is the local disk."""
    if "://" not in location:
        return pafs.LocalFileSystem(), os.path.abspath(location)
    try:
        return pafs.FileSystem.from_uri(location)
    except Exception as exc:  # noqa: BLE001 - pyarrow raises ArrowInvalid/OSError; name the location
        raise MirrorError(f"cannot read table location {location}: {exc}") from exc


def formats_at(location: str) -> list[str]:
    """The formats whose files are at ``location`` (sorted; empty: no table there yet)."""
    fs, root = _filesystem(location)
    root = root.rstrip("/")
    found = []
    if fs.get_file_info(f"{root}/{DELTA_MARK}").type == pafs.FileType.Directory:
        found.append("delta")
    meta = f"{root}/{ICEBERG_MARK}"
    if fs.get_file_info(meta).type == pafs.FileType.Directory:
        files = fs.get_file_info(pafs.FileSelector(meta))
        if any(f.base_name.endswith(".metadata.json") for f in files):
            found.append("iceberg")
    return found


def evidence(fmt: str) -> str:
    """What showed the format, for messages."""
    return {"delta": f"a {DELTA_MARK}/ directory", "iceberg": f"Iceberg {ICEBERG_MARK}/*.metadata.json files"}[fmt]
