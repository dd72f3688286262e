"""Which table format a location holds, from what each format writes there (no table library needed).

A Delta table keeps its log in ``<location>/_delta_log/``; an Iceberg table (pyiceberg's, Spark's, any
catalog's) its metadata files in ``<location>/metadata/*.metadata.json``. A location is a path or a URI the
table's store reads (``s3://``, ``gs://``, ``az://``, ``abfss://``, ``file://``), with its storage settings.
"""

from __future__ import annotations

from collections.abc import Mapping

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.store import Store, StoreError, open_store, uri

DELTA_MARK = "_delta_log"
ICEBERG_MARK = "metadata"
NAMES = {"delta": "a Delta", "iceberg": "an Iceberg"}


def formats_at(location: str, storage_options: Mapping[str, str] | None = None) -> list[str]:
    """The formats whose files are at ``location`` (sorted; empty: no table there yet)."""
    return formats_in(open_store(location, storage_options), location)


def formats_in(store: Store, location: str) -> list[str]:
    """:func:`formats_at` through the location's own ``store``."""
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


def refuse_occupied(store: Store, location: str, making: str, catalog: str = "the catalog") -> None:
    """Before a new table of format ``making`` is made at ``location`` (created, or opened to be made by a
    snapshot's ``add_files``): a MirrorError naming what is there if the location already holds a table of
    either format (Iceberg metadata files, a Delta log), and nothing written. Two tables at one location delete
    each other's files (one's vacuum removes every file of the other, which it never referenced). ``catalog``:
    the Iceberg catalog making it, for the message (the table found is not in it: it is another catalog's), e.g.
    ``catalog 'lake'``."""
    # (a Delta log delta-rs does not read as a table, e.g. a killed first commit's, is delta-rs's to answer)
    found = [f for f in formats_in(store, location) if not f == making == "delta"]
    if not found:
        return
    fmt = "iceberg" if "iceberg" in found else found[0]
    what = f"{location} already holds {NAMES[fmt]} table ({evidence(fmt)})"
    if fmt == making == "iceberg":
        raise MirrorError(f"{what}, which {catalog} does not have: another catalog's table (a mistyped --catalog or "
                          "--catalog-uri; a second host with its own default SQLite catalog), and a second table "
                          "there would delete its files. Nothing was written. Give the --catalog / --catalog-uri "
                          "that table is registered in, or another --table location")
    if fmt == "iceberg":
        raise MirrorError(f"{what}: no Delta table can be made there (each would delete the other's files). Nothing "
                          "was written. Give --table-format iceberg (and the table's --catalog), or another --table "
                          "location")
    raise MirrorError(f"{what}: no {NAMES[making].split()[-1]} table can be made there (each would delete the "
                      f"other's files). Nothing was written. Give --table-format {fmt}, or another --table location")
