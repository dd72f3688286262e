"""The mirror's table arguments, defined once for every mirror command: ``run``, ``compact``, ``orphans``,
``vacuum``, ``verify`` and ``status`` (a new table setting, e.g. a catalog or storage options, is added here
and reaches them all through :func:`table_options`).

``--storage-option KEY=VALUE`` (repeatable) sets the object store's settings (object_store's keys, over the
``AWS_*`` / ``GOOGLE_*`` / ``AZURE_*`` environment: docs/mirror.md "Where the table lives"); they are resolved
on the driver and shipped to the tasks. Spark's checkpoint stays on the driver's disk (it goes through Hadoop's
file system, and the mirror reads it locally): a table in object storage takes ``--checkpoint DIR``.

``--table-format`` has one rule: by default the format is what the location holds (a ``_delta_log/`` is
Delta, Iceberg ``metadata/*.metadata.json`` is Iceberg); it is needed only to create a table (``mirror run``
on an empty location); an explicit format the location contradicts is refused naming both. ``--catalog NAME``
(a pyiceberg catalog) means Iceberg: with it ``--table`` may name the table as ``namespace.table``, and a new
table needs no ``--table-format``; a catalog argument given for a Delta table is refused naming both.
"""

from __future__ import annotations

import argparse
from typing import Any

from msgstream_spark.cli.vocab import UsageError, parse_kv
from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.formats import registry
from msgstream_spark.mirror.store import uri


def format_help(creates: bool) -> str:
    """``--table-format``'s help, from the registry."""
    held = ", ".join(f"{registry.evidence(n)}: {registry.get(n).title}" for n in registry.names())
    return (f"{' or '.join(registry.names())} (default: what the location holds: {held}"
            f"{'; required to create a table' if creates else ''})")

CATALOG_URI_HELP = ("Iceberg: the SQL catalog's URI, a SQLAlchemy URL (default: the SQLite file "
                    "<table>_catalog.sqlite next to the table, made with the table; a table of an earlier release "
                    "keeps <table>/catalog.sqlite)")
CATALOG_HELP = ("Iceberg: the pyiceberg catalog NAME the table is registered in, configured as pyiceberg users "
                "configure one (.pyiceberg.yaml, PYICEBERG_CATALOG__<NAME>__<KEY> variables); with it --table is a "
                "location or namespace.table (the catalog chooses the location). Default: the SQLite catalog "
                "beside a local table")
CATALOG_OPTION_HELP = ("Iceberg: a property of the --catalog over its configuration (repeatable), e.g. "
                       "uri=postgresql+psycopg2://user:PASSWORD@host/db, warehouse=s3://bucket/lake")


def add_table_args(p: argparse.ArgumentParser, *, creates: bool = False, checkpoint: bool = True) -> None:
    """``--table``, ``--table-format``, ``--catalog-uri``, ``--catalog``, ``--catalog-option`` and (``checkpoint``)
    ``--checkpoint``.
    ``creates``: the command makes the table when there is none (``mirror run``)."""
    p.add_argument("--table", required=True, metavar="LOCATION",
                   help="the mirrored table's location (a directory or URI; Iceberg: the table's own location)")
    p.add_argument("--table-format", choices=registry.names(), default=None, help=format_help(creates))
    p.add_argument("--catalog-uri", metavar="URI", help=CATALOG_URI_HELP)
    p.add_argument("--catalog", metavar="NAME", help=CATALOG_HELP)
    p.add_argument("--catalog-option", action="append", default=[], metavar="KEY=VALUE", help=CATALOG_OPTION_HELP)
    p.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                   help="an object store setting of the table (repeatable; object_store's keys, e.g. aws_endpoint, "
                        "aws_region, aws_allow_http; over the AWS_*/GOOGLE_*/AZURE_* environment; secrets are masked "
                        "in every log line and error)")
    if checkpoint:
        p.add_argument("--checkpoint", metavar="DIR",
                       help="the mirror job's checkpoint, a directory on the driver's disk (default for a local "
                            "table: <table>_checkpoint; required for a table in object storage or named "
                            "namespace.table)")


def resolve_table_format(args: argparse.Namespace, *, create: bool = False) -> str:
    """Set ``args.table_format`` by the rule above and return it. UsageError for a format the location
    contradicts, a location holding two, a new table without a format (``create``), a catalog argument with
    a format without catalogs; MirrorError when there is no table and the command does not create one."""
    given = args.table_format
    if getattr(args, "catalog_option", None) and not getattr(args, "catalog", None):
        raise UsageError("--catalog-option sets a property of a named catalog: give --catalog NAME too")
    cataloged = registry.with_feature("catalogs")
    if registry.names_in_catalog(args.table, getattr(args, "catalog", None)):  # namespace.table: a catalog's
        return _named_in_catalog(args, given, cataloged, create)
    found = registry.detect_at(args.table, storage_options(args))
    if given and found and given not in found:
        raise UsageError(f"--table-format {given}, but {args.table} holds {registry.get(found[0]).article} table "
                         f"({registry.evidence(found[0])}): pass --table-format {found[0]}, or leave the flag out")
    if not given and len(found) > 1:
        raise UsageError(f"{args.table} holds {'both ' if len(found) == 2 else ''}{_both(found, ' and ')} table "
                         f"({', '.join(registry.evidence(f) for f in found)}): pass "
                         f"{' or '.join('--table-format ' + f for f in found)}")
    fmt = given or (found[0] if found else None) or (cataloged[0] if getattr(args, "catalog", None) else None)
    if fmt is None and create:
        raise UsageError(f"there is no table at {args.table} yet: pass "
                         f"{' or '.join('--table-format ' + f for f in registry.names())} to say which one to create")
    if fmt is None:
        raise MirrorError(f"there is no mirror table at {args.table} (neither "
                          f"{' nor '.join(registry.evidence(f) for f in registry.names())})")
    flags = _catalog_args(args)
    if not registry.has(fmt, "catalogs") and flags:
        f = registry.get(fmt)
        raise UsageError(f"{' and '.join(flags)} name{'s' if len(flags) == 1 else ''} {_both(cataloged, ' or ')} "
                         f"catalog, but {args.table} is {f.article} table"
                         f"{'' if given else ' (' + registry.evidence(fmt) + ')'}: leave {' and '.join(flags)} out")
    args.table_format = fmt
    return fmt


def _both(names: list[str], sep: str) -> str:
    """ "a Delta and an Iceberg" (``sep`` between the formats' articles)."""
    return sep.join(registry.get(n).article for n in names)


def _named_in_catalog(args: argparse.Namespace, given: str | None, cataloged: list[str], create: bool) -> str:
    """The format of a table ``--table`` names as ``namespace.table`` in ``--catalog`` (the one with catalogs)."""
    if given and given not in cataloged:
        raise UsageError(f"--table {args.table} with --catalog {args.catalog} names {_both(cataloged, ' or ')} "
                         f"table, but --table-format is {given}: leave --table-format out (or give "
                         f"{registry.get(given).article} table's location without --catalog)")
    if create:
        checkpoint_of(args, required=True)  # the job's checkpoint: no default beside a table named so
    args.table_format = given or cataloged[0]
    return args.table_format


def _catalog_args(args: argparse.Namespace) -> list[str]:
    """The catalog flags given (each Iceberg's only)."""
    return [flag for flag, dest in (("--catalog-uri", "catalog_uri"), ("--catalog", "catalog"),
                                    ("--catalog-option", "catalog_option")) if getattr(args, dest, None)]


def storage_options(args: argparse.Namespace) -> dict[str, str] | None:
    """The ``--storage-option`` pairs (None: none given)."""
    return parse_kv(getattr(args, "storage_option", None), "--storage-option") or None


def table_options(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of ``open_table`` / ``open_existing`` / ``table_identity`` the flags give."""
    return {"catalog_uri": getattr(args, "catalog_uri", None), "storage_options": storage_options(args),
            "catalog": getattr(args, "catalog", None),
            "catalog_options": catalog_options(getattr(args, "catalog_option", None) or [])}


def catalog_options(pairs: list[str]) -> dict[str, str] | None:
    """``--catalog-option KEY=VALUE`` pairs as a mapping (None: none given); a pair without ``=`` is a UsageError
    that shows its key only (a value may be a secret)."""
    out: dict[str, str] = {}
    for i, pair in enumerate(pairs, 1):
        key, eq, value = pair.partition("=")
        if not eq or not key.strip():
            raise UsageError(f"--catalog-option #{i} is not KEY=VALUE (e.g. --catalog-option warehouse=s3://b/lake)")
        out[key.strip()] = value
    return out or None


def checkpoint_of(args: argparse.Namespace, required: bool = False) -> str | None:
    """``--checkpoint`` (a directory on the driver's disk), default ``<table>_checkpoint`` for a local table; for
    a table in object storage or named ``namespace.table`` in a catalog None, or (``required``: the job) a
    UsageError saying to pass one."""
    given = getattr(args, "checkpoint", None)
    if given:
        loc = uri.parse(given)
        if loc.kind != "local":
            raise UsageError(f"--checkpoint {given}: Spark's checkpoint is a directory on the driver's disk (the "
                             "mirror reads it there; Spark writes it through Hadoop's file system): pass a local "
                             "directory")
        return loc.key if "://" in given else given
    if registry.names_in_catalog(args.table, getattr(args, "catalog", None)):
        if required:
            raise UsageError(f"--table {args.table} names a table in catalog {args.catalog}, which has no directory "
                             "beside it for the job's checkpoint: pass --checkpoint DIR, a directory on the driver's "
                             "disk")
        return None
    table = uri.parse(args.table)
    if table.kind == "local":
        return (table.key if "://" in args.table else args.table.rstrip("/")) + "_checkpoint"
    if required:
        raise UsageError(f"--table {args.table} is in object storage: pass --checkpoint DIR, a directory on the "
                         "driver's disk for Spark's checkpoint (docs/mirror.md, \"Where the table lives\")")
    return None
