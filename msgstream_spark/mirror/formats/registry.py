"""The table formats by name, and everything the rest of the code asks of a format: open or create a table,
read its stored properties, detect the format a location holds, pin a version for a read, which features it
has. Nothing outside ``mirror/formats/`` names a format or tests a table's class (tests/test_layers.py checks
the source); a new format is one more entry in ``_ENTRIES``.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Any

import pyarrow as pa

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.formats import detect
from msgstream_spark.mirror.formats.base import ChangeLog, Format, MirrorTable, Pinned
from msgstream_spark.mirror.formats.delta.append import append_rows
from msgstream_spark.mirror.formats.delta.changelog import DeltaChangeLog
from msgstream_spark.mirror.formats.delta.handle import LOG_STORE_KEYS
from msgstream_spark.mirror.formats.delta.pinned import DeltaPinned
from msgstream_spark.mirror.formats.delta.table import DeltaMirrorTable
from msgstream_spark.mirror.formats.iceberg.catalog import is_identifier
from msgstream_spark.mirror.formats.iceberg.pinned import IcebergPinned
from msgstream_spark.mirror.formats.iceberg.table import IcebergMirrorTable
from msgstream_spark.mirror.formats.lance.maintain import compact as lance_compact
from msgstream_spark.mirror.formats.lance.pinned import LancePinned
from msgstream_spark.mirror.formats.lance.staged import FILE_SUFFIXES as LANCE_FILES
from msgstream_spark.mirror.formats.lance.table import LanceMirrorTable
from msgstream_spark.mirror.store.settings import accept_library_keys

_CATALOG = ("catalog_uri", "storage_options", "catalog", "catalog_options")


def _iceberg_stored(location: str, *, catalog_uri: str | None = None, **more: Any) -> dict[str, str]:
    return IcebergMirrorTable.stored_properties(location, catalog_uri, **more)


_ENTRIES = (
    Format("delta", "Delta", DeltaMirrorTable, DeltaMirrorTable.open, DeltaMirrorTable.stored_properties,
           DeltaPinned, history=True, storage_keys={"s3": LOG_STORE_KEYS}),
    Format("iceberg", "Iceberg", IcebergMirrorTable, IcebergMirrorTable.open, _iceberg_stored, IcebergPinned,
           takes=_CATALOG, partitions=True, catalogs=True),
    Format("lance", "Lance", LanceMirrorTable, LanceMirrorTable.open, LanceMirrorTable.stored_properties,
           LancePinned, compact=lance_compact, file_suffixes=LANCE_FILES),
)
FORMATS: dict[str, Format] = {f.name: f for f in _ENTRIES}
for _f in _ENTRIES:  # the store's settings accept the keys each format's library reads itself
    for _kind, _keys in _f.storage_keys.items():
        accept_library_keys(_kind, _keys)


def names() -> tuple[str, ...]:
    """Every format's name, as ``--table-format`` takes it."""
    return tuple(FORMATS)


def default() -> str:
    """The format a table is created in when the caller has no preference (the demo): the first entry."""
    return _ENTRIES[0].name


def get(name: str) -> Format:
    """The format called ``name``; MirrorError naming the known ones for another name."""
    f = FORMATS.get(name)
    if f is None:
        raise MirrorError(f"table format must be one of {names()}, got {name!r}")
    return f


def of(table: Any) -> Format:
    """The format of an open ``table``; MirrorError for an object no format made."""
    for f in _ENTRIES:
        if isinstance(table, f.table):
            return f
    raise MirrorError(f"{type(table).__name__} is no table of the formats {names()}")


def with_feature(feature: str) -> list[str]:
    """The names of the formats that have ``feature`` (``history``, ``partitions``, ``time_travel``,
    ``catalogs``)."""
    return [f.name for f in _ENTRIES if getattr(f, feature)]


def has(name: str, feature: str) -> bool:
    """Whether format ``name`` has ``feature``."""
    return bool(getattr(get(name), feature))


def titles(feature: str) -> str:
    """The formats that have ``feature``, for messages: "Delta", "Delta or Iceberg"."""
    return " or ".join(get(n).title for n in with_feature(feature))


def flags(feature: str) -> str:
    """The ``--table-format`` flags of the formats that have ``feature``, for messages."""
    return " or ".join(f"--table-format {n}" for n in with_feature(feature))


def _given(f: Format, options: Mapping[str, Any]) -> dict[str, Any]:
    """The options format ``f`` takes that were given (one that takes none of a setting keeps its defaults)."""
    return {k: v for k, v in options.items() if k in f.takes and v is not None}


def open_table(name: str, location: str, *, collection: str, pk: str, arrow_schema: pa.Schema | None = None,
               create: bool = True, collection_id: int | None = None, **options: Any) -> MirrorTable:
    """Format ``name``'s table at ``location`` (``options``: ``catalog_uri``, ``storage_options``, ``catalog``,
    ``catalog_options``; those the format does not take are left out)."""
    f = get(name)
    return f.open(location, collection=collection, pk=pk, arrow_schema=arrow_schema, create=create,
                  collection_id=collection_id, **_given(f, options))


def stored_properties(name: str, location: str, **options: Any) -> dict[str, str]:
    """The ``msgstream.*`` properties of format ``name``'s table at ``location``; MirrorError if there is none."""
    f = get(name)
    return f.stored_properties(location, **_given(f, options))


def append_report(location: str, rows: pa.Table, storage_options: Mapping[str, str] | None = None) -> None:
    """``rows`` appended to a report table of the mirror's own at ``location`` (a Delta table, whatever the
    mirrored table's format: docs/mirror.md, verify's ``--report-table``)."""
    append_rows(location, rows, storage_options)


def change_log(location: str, pk: str, storage_options: Mapping[str, str] | None = None) -> ChangeLog:
    """The mirror's change history at ``location``: an append-only log of the files tasks write, one version per
    batch (a Delta table, whatever the mirrored table's format: docs/mirror.md, History)."""
    return DeltaChangeLog(location, pk, storage_options)


def pin(table: Any) -> Pinned:
    """``table`` read at its current version (later commits are not seen)."""
    return of(table).pin(table)


def detect_at(location: str, storage_options: Mapping[str, str] | None = None) -> list[str]:
    """The names of the formats whose files are at ``location`` (sorted; empty: no table there yet)."""
    return detect.formats_at(location, storage_options)


def evidence(name: str) -> str:
    """What shows format ``name`` at a location, for messages."""
    return detect.evidence(name)


def names_in_catalog(table: str, catalog: str | None) -> bool:
    """Whether ``table`` names a table in ``catalog`` (``namespace.table``; only a format with catalogs has
    them) rather than a location."""
    return is_identifier(table, catalog)


def upkeep(table: Any) -> Any:
    """The module keeping ``table``'s history bounded while a mirror job runs (``versions``, ``trim``,
    ``figures``, ``manifests``, ``merge_manifests``: ``delta/upkeep.py``, ``iceberg/upkeep.py``); None for a
    format without one (the job then compacts only)."""
    module = f"msgstream_spark.mirror.formats.{of(table).name}.upkeep"
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        if e.name != module:  # a library the module needs is missing: not "no such module"
            raise
        return None
