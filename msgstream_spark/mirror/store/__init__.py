"""Where a mirrored table lives: one small interface (:class:`Store`) for every read, write, listing and
conditional put, on a local directory or an object store (S3, GCS, Azure) named by a URI.

``open_store(location, storage_options=None)`` resolves the storage settings (the environment's object_store
variables, overridden by explicit options; :mod:`.settings`) and returns a picklable :class:`Store`.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from msgstream_spark.mirror.store import uri
from msgstream_spark.mirror.store.base import COUNTS, ObjectMeta, Store, io_since, io_totals
from msgstream_spark.mirror.store.errors import AlreadyExists, Conflict, NotFound, StoreError
from msgstream_spark.mirror.store.lease import Lease, LeaseHeld, LeaseLost
from msgstream_spark.mirror.store.local import LocalStore
from msgstream_spark.mirror.store.objstore import ObjectStore
from msgstream_spark.mirror.store.settings import mask, resolve_options


def open_store(location: str, storage_options: Mapping[str, Any] | None = None,
               env: Mapping[str, str] | None = None) -> Store:
    """The store of ``location`` (a URI or a local path), its settings resolved from ``env`` (default: the
    process environment) and ``storage_options``."""
    loc = uri.parse(location)
    if loc.kind == "local":
        return LocalStore(str(location), {})
    return ObjectStore(str(location), resolve_options(loc.kind, storage_options, env))


def store_for(location: str, resolved: Mapping[str, str] | None = None) -> Store:
    """The store of ``location`` from settings already resolved (``Store.options`` of the driver's store): what
    a Spark task builds, never reading its own environment (executors lack the driver's)."""
    if uri.parse(location).kind == "local":
        return LocalStore(str(location), {})
    return ObjectStore(str(location), dict(resolved or {}), shipped=True)


__all__ = ["COUNTS", "AlreadyExists", "Conflict", "Lease", "LeaseHeld", "LeaseLost", "LocalStore", "NotFound",
           "ObjectMeta", "ObjectStore", "Store", "StoreError", "io_since", "io_totals", "mask", "open_store",
           "resolve_options", "store_for"]
