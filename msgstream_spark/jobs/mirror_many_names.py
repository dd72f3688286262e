"""Where the many-collection job's tables are named, beside ``jobs.mirror_many``: Iceberg tables in a catalog's
namespace (``--catalog NAME --namespace NS``: identifiers ``NS.<database>__<collection>``, ``mirror.many``'s
``table_identifier``) and the name a renamed collection's table keeps (docs/mirror.md, Many collections).
"""

from __future__ import annotations

import argparse
import logging

from msgstream_spark.cli.table_args import table_options
from msgstream_spark.cli.vocab import UsageError
from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.common import PROP_COLLECTION, PROP_COLLECTION_ID
from msgstream_spark.mirror.many import Known

log = logging.getLogger("msgstream_spark.jobs.mirror")


def check_namespace_args(args: argparse.Namespace) -> None:
    """``--catalog NAME --namespace NS``: Iceberg tables in a catalog's namespace (no --table-root; --checkpoint
    given: there is no directory beside the tables)."""
    if args.table_root:
        raise UsageError("--namespace puts the tables into --catalog's namespace: not with --table-root")
    if not args.catalog:
        raise UsageError("--namespace NS names a namespace of a catalog: pass --catalog NAME (a pyiceberg catalog)")
    from msgstream_spark.mirror.formats import registry

    cataloged = registry.with_feature("catalogs")  # the formats whose tables a catalog keeps
    fmt = args.table_format or cataloged[0]
    if fmt not in cataloged:
        raise UsageError(f"--catalog/--namespace keep {registry.titles('catalogs')} tables: not --table-format {fmt} "
                         f"(use {registry.flags('catalogs')})")
    if not args.checkpoint:
        raise UsageError("--namespace: pass --checkpoint DIR, a directory on the driver's disk for Spark's checkpoint "
                         "(the tables' catalog places them: there is no directory beside them)")
    args.table_format = fmt
    args.table_root = None


def catalog_holder(fmt: str, identifier: str, more: dict) -> int | None:
    """The collection id the catalog's table ``identifier`` records (None: the catalog has no such table; -1: a
    table that records none)."""
    from msgstream_spark.mirror.formats import registry

    try:
        cid = registry.stored_properties(fmt, identifier, **more).get(PROP_COLLECTION_ID)
    except MirrorError as exc:
        log.debug("%s: %s (taken as no table there)", identifier, exc)
        return None
    return int(cid) if cid else -1


def stored_name(args: argparse.Namespace, k: Known, where: str) -> str:
    """The collection name the table at ``where`` records: the one it was made with, for a collection renamed
    since (2.6.6+: the table stays where it is, keyed by the collection id); else the collection's name."""
    if k.renamed_ts is None or not k.location:
        return k.name
    from msgstream_spark.mirror.formats import registry

    more = table_options(args)
    if not getattr(args, "namespace", None) and not registry.detect_at(where, more["storage_options"]):
        return k.name
    try:
        return registry.stored_properties(args.table_format, where, **more).get(PROP_COLLECTION) or k.name
    except MirrorError as exc:
        log.debug("%s: %s (the collection's name taken)", where, exc)
        return k.name
