"""The mirror's table arguments, defined once for every mirror command: ``run``, ``compact``, ``orphans``,
``vacuum``, ``verify`` and ``status`` (a new table setting, e.g. a catalog or storage options, is added here
and reaches them all through :func:`table_options`).

``--table-format`` has one rule: by default the format is what the location holds (a ``_delta_log/`` is
Delta, Iceberg ``metadata/*.metadata.json`` is Iceberg); it is needed only to create a table (``mirror run``
on an empty location); an explicit format the location contradicts is refused naming both.
"""

from __future__ import annotations

import argparse
from typing import Any

from msgstream_spark.cli.vocab import UsageError
from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.formats.detect import evidence, formats_at
from msgstream_spark.mirror.table import FORMATS

NAMES = {"delta": "a Delta", "iceberg": "an Iceberg"}
FORMAT_HELP = ("delta or iceberg (default: what the location holds: a _delta_log/ is Delta, Iceberg "
               "metadata/ is Iceberg{create})")
CATALOG_URI_HELP = ("Iceberg: the SQL catalog's URI, a SQLAlchemy URL (default: the SQLite file "
                    "<table>_catalog.sqlite next to the table, made with the table; a table of an earlier release "
                    "keeps <table>/catalog.sqlite)")


def add_table_args(p: argparse.ArgumentParser, *, creates: bool = False, checkpoint: bool = True) -> None:
    """``--table``, ``--table-format``, ``--catalog-uri`` and (``checkpoint``) ``--checkpoint``.
    ``creates``: the command makes the table when there is none (``mirror run``)."""
    p.add_argument("--table", required=True, metavar="LOCATION",
                   help="the mirrored table's location (a directory or URI; Iceberg: the table's own location)")
    p.add_argument("--table-format", choices=FORMATS, default=None,
                   help=FORMAT_HELP.format(create="; required to create a table" if creates else ""))
    p.add_argument("--catalog-uri", metavar="URI", help=CATALOG_URI_HELP)
    if checkpoint:
        p.add_argument("--checkpoint", metavar="LOCATION",
                       help="the mirror job's checkpoint (default: <table>_checkpoint)")


def resolve_table_format(args: argparse.Namespace, *, create: bool = False) -> str:
    """Set ``args.table_format`` by the rule above and return it. UsageError for a format the location
    contradicts, a location holding both, a new table without a format (``create``), ``--catalog-uri`` with
    a Delta table; MirrorError when there is no table and the command does not create one."""
    found = formats_at(args.table)
    given = args.table_format
    if given and found and given not in found:
        raise UsageError(f"--table-format {given}, but {args.table} holds {NAMES[found[0]]} table "
                         f"({evidence(found[0])}): pass --table-format {found[0]}, or leave the flag out")
    if not given and len(found) > 1:
        raise UsageError(f"{args.table} holds both a Delta and an Iceberg table ({evidence('delta')}, "
                         f"{evidence('iceberg')}): pass --table-format delta or --table-format iceberg")
    fmt = given or (found[0] if found else None)
    if fmt is None and create:
        raise UsageError(f"there is no table at {args.table} yet: pass --table-format delta or --table-format "
                         "iceberg to say which one to create")
    if fmt is None:
        raise MirrorError(f"there is no mirror table at {args.table} (neither {evidence('delta')} nor "
                          f"{evidence('iceberg')})")
    if fmt == "delta" and getattr(args, "catalog_uri", None):
        raise UsageError(f"--catalog-uri names an Iceberg catalog, but {args.table} is a Delta table"
                         f"{'' if given else ' (' + evidence('delta') + ')'}: leave --catalog-uri out")
    args.table_format = fmt
    return fmt


def table_options(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of ``open_table`` / ``open_existing`` / ``table_identity`` the flags give."""
    return {"catalog_uri": getattr(args, "catalog_uri", None)}


def checkpoint_of(args: argparse.Namespace) -> str:
    """``--checkpoint``, default ``<table>_checkpoint``."""
    return getattr(args, "checkpoint", None) or args.table.rstrip("/") + "_checkpoint"
