"""The mirror's table arguments, defined once for every mirror command: ``run``, ``compact``, ``orphans``,
``vacuum``, ``verify`` and ``status`` (a new table setting, e.g. a catalog or storage options, is added here
and reaches them all through :func:`table_options`).

``--storage-option KEY=VALUE`` (repeatable) sets the object store's settings (object_store's keys, over the
``AWS_*`` / ``GOOGLE_*`` / ``AZURE_*`` environment: docs/mirror.md "Where the table lives"); they are resolved
on the driver and shipped to the tasks. Spark's checkpoint stays on the driver's disk (it goes through Hadoop's
file system, and the mirror reads it locally): a table in object storage takes ``--checkpoint DIR``.

``--table-format`` has one rule: by default the format is what the location holds (a ``_delta_log/`` is
Delta, Iceberg ``metadata/*.metadata.json`` is Iceberg); it is needed only to create a table (``mirror run``
on an empty location); an explicit format the location contradicts is refused naming both.
"""

from __future__ import annotations

import argparse
from typing import Any

from msgstream_spark.cli.vocab import UsageError, parse_kv
from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.formats.detect import evidence, formats_at
from msgstream_spark.mirror.store import uri
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
    p.add_argument("--storage-option", action="append", default=[], metavar="KEY=VALUE",
                   help="an object store setting of the table (repeatable; object_store's keys, e.g. aws_endpoint, "
                        "aws_region, aws_allow_http; over the AWS_*/GOOGLE_*/AZURE_* environment; secrets are masked "
                        "in every log line and error)")
    if checkpoint:
        p.add_argument("--checkpoint", metavar="DIR",
                       help="the mirror job's checkpoint, a directory on the driver's disk (default for a local "
                            "table: <table>_checkpoint; required for a table in object storage)")


def resolve_table_format(args: argparse.Namespace, *, create: bool = False) -> str:
    """Set ``args.table_format`` by the rule above and return it. UsageError for a format the location
    contradicts, a location holding both, a new table without a format (``create``), ``--catalog-uri`` with
    a Delta table; MirrorError when there is no table and the command does not create one."""
    found = formats_at(args.table, storage_options(args))
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


def storage_options(args: argparse.Namespace) -> dict[str, str] | None:
    """The ``--storage-option`` pairs (None: none given)."""
    return parse_kv(getattr(args, "storage_option", None), "--storage-option") or None


def table_options(args: argparse.Namespace) -> dict[str, Any]:
    """The keyword arguments of ``open_table`` / ``open_existing`` / ``table_identity`` the flags give."""
    return {"catalog_uri": getattr(args, "catalog_uri", None), "storage_options": storage_options(args)}


def checkpoint_of(args: argparse.Namespace, required: bool = False) -> str | None:
    """``--checkpoint`` (a directory on the driver's disk), default ``<table>_checkpoint`` for a local table; for
    a table in object storage None, or (``required``: the job) a UsageError saying to pass one."""
    given = getattr(args, "checkpoint", None)
    if given:
        loc = uri.parse(given)
        if loc.kind != "local":
            raise UsageError(f"--checkpoint {given}: Spark's checkpoint is a directory on the driver's disk (the "
                             "mirror reads it there; Spark writes it through Hadoop's file system): pass a local "
                             "directory")
        return loc.key if "://" in given else given
    table = uri.parse(args.table)
    if table.kind == "local":
        return (table.key if "://" in args.table else args.table.rstrip("/")) + "_checkpoint"
    if required:
        raise UsageError(f"--table {args.table} is in object storage: pass --checkpoint DIR, a directory on the "
                         "driver's disk for Spark's checkpoint (docs/mirror.md, \"Where the table lives\")")
    return None
