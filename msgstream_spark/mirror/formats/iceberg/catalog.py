"""Which Iceberg catalog a mirrored table is registered in, configured the way pyiceberg users configure one.

``--catalog NAME`` loads pyiceberg's catalog ``NAME``: its properties from ``.pyiceberg.yaml`` (``PYICEBERG_HOME``,
the home directory, the working directory) and ``PYICEBERG_CATALOG__<NAME>__<KEY>`` variables, overridden by
``--catalog-option KEY=VALUE``; the table's storage settings (``--storage-option`` and the object_store variables)
fill in the FileIO properties the catalog's own configuration leaves out (``s3.endpoint``, ``s3.access-key-id``,
...), so data, manifests and delete files go to the same store as the table. Without a name, today's default:
the SQL catalog on SQLite beside a local table (or the SQL catalog at ``catalog_uri``); a table in object
storage has no disk beside it, so it needs a named catalog or a ``catalog_uri``.

With a named catalog the table is either a location (a URI, or a path with a ``/``: the table is created there
as ``msgstream.<last path segment>``) or an identifier ``namespace.table``, which the catalog places where it
chooses (REST catalogs that assign locations themselves): :func:`locate`.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from msgstream_spark.errors import ConfigError, MirrorError
from msgstream_spark.mirror.formats.iceberg.cached import cache_metadata
from msgstream_spark.mirror.store import open_store, uri
from msgstream_spark.mirror.store.settings import mask

NAMESPACE = "msgstream"


def _catalog_uri(location: str, catalog_uri: str | None) -> str:
    if catalog_uri:
        return catalog_uri
    loc = os.path.abspath(location).rstrip("/")
    inside = os.path.join(loc, "catalog.sqlite")  # where an earlier release put it
    return f"sqlite:///{inside if os.path.exists(inside) else loc + '_catalog.sqlite'}"


def _catalog(location: str, catalog_uri: str | None, create: bool = True):
    """The default SQL catalog of a local table (None: the default SQLite file does not exist and ``create`` is
    False: no table yet)."""
    try:
        from pyiceberg.catalog.sql import SqlCatalog
    except ImportError as e:
        raise MirrorError("the iceberg table format needs 'pyiceberg' and 'sqlalchemy': pip install "
                          "'msgstream-spark[mirror]'") from e
    location = uri.parse(location).key
    cat_uri = _catalog_uri(location, catalog_uri)
    if not create and cat_uri.startswith("sqlite:///") and not os.path.exists(cat_uri.removeprefix("sqlite:///")):
        return None
    os.makedirs(location, exist_ok=True)
    cat = cache_metadata(SqlCatalog("msgstream", uri=cat_uri, warehouse=f"file://{location}"))
    cat.create_namespace_if_not_exists(NAMESPACE)
    return cat


def _identifier(collection: str) -> tuple[str, str]:
    """The default catalog's name of a collection's table."""
    return NAMESPACE, re.sub(r"[^A-Za-z0-9_]", "_", collection)


def is_identifier(table: str, catalog: str | None) -> bool:
    """Whether ``--table`` names the table in catalog ``catalog`` (``namespace.table``: a named catalog, and no
    scheme or path separator) rather than giving its location."""
    return bool(catalog) and "://" not in table and "/" not in table and os.sep not in table


def table_identifier(location: str, given: str | None = None) -> tuple[str, ...]:
    """``given`` (``namespace.table``, namespaces may nest: ``a.b.table``) split, or the location's last path
    segment in the ``msgstream`` namespace (``s3://bucket/lake/books`` -> ``("msgstream", "books")``)."""
    if given:
        parts = tuple(p for p in given.split(".") if p)
        if len(parts) < 2:
            raise ConfigError(f"table {given!r}: with --catalog, give the table as namespace.table (or its location: "
                              "a URI, or a path with a '/', e.g. ./books)")
        return parts
    loc = uri.parse(location)
    last = loc.key.rstrip("/").rsplit("/", 1)[-1]
    if not last:
        raise ConfigError(f"table location {location!r} has no last path segment to name the Iceberg table after "
                          "(give the identifier as namespace.table)")
    return NAMESPACE, re.sub(r"[^A-Za-z0-9_]", "_", last)


def catalog_properties(name: str, options: Mapping[str, str] | None = None,
                       file_io: Mapping[str, str] | None = None) -> dict[str, Any]:
    """The properties pyiceberg would load catalog ``name`` with (yaml, then environment variables, both read
    now), the storage's FileIO properties where those leave a key out, then ``options`` over all."""
    conf = _configured(name)
    if not conf and not (options or {}):
        raise ConfigError(f"Iceberg catalog {name!r} is not configured: no 'catalog: {name}:' entry in "
                          ".pyiceberg.yaml (PYICEBERG_HOME, the home directory or the working directory) and no "
                          f"PYICEBERG_CATALOG__{name.upper()}__<KEY> variables; or give --catalog-option KEY=VALUE")
    return {**{k: v for k, v in (file_io or {}).items() if k not in conf}, **conf, **dict(options or {})}


def _configured(name: str) -> dict[str, Any]:
    from pyiceberg.utils.config import Config

    return dict(Config().get_catalog_config(name.lower()) or {})


def _store_location(location: str, name: str | None, options: Mapping[str, str] | None) -> str:
    """The location whose kind of store the storage settings are read for: the table's, or for a table named by
    identifier the catalog's warehouse if it is a URI (else S3's settings: the common case; a catalog on another
    store carries its FileIO properties in its own configuration)."""
    if not is_identifier(location, name):
        return location
    warehouse = str({**_configured(name or ""), **dict(options or {})}.get("warehouse", ""))
    return warehouse if "://" in warehouse else "s3://warehouse"


def resolve_catalog(location: str, *, name: str | None = None, options: Mapping[str, str] | None = None,
                    catalog_uri: str | None = None, storage_options: Mapping[str, Any] | None = None,
                    create: bool = True):
    """The pyiceberg catalog of the table at ``location`` (None: the default SQLite catalog does not exist and
    ``create`` is False; a named catalog creates no namespace: :func:`ensure_namespace`). Errors name the catalog
    and never show a secret."""
    store = open_store(_store_location(location, name, options), storage_options)
    if name is None and store.kind == "local":
        return _catalog(location, catalog_uri, create)  # today's default: SQLite beside the table
    try:
        from pyiceberg.catalog import load_catalog
    except ImportError as e:
        raise MirrorError("the iceberg table format needs 'pyiceberg': pip install 'msgstream-spark[mirror]'") from e
    file_io = store.pyiceberg_properties()
    if name is None:
        if not catalog_uri:
            raise ConfigError(f"Iceberg table {location}: a table in object storage is registered in a catalog you "
                              "run: give --catalog NAME (configured in .pyiceberg.yaml or PYICEBERG_CATALOG__NAME__*)"
                              " or a SQL catalog's catalog_uri")
        name, props = "msgstream", {"type": "sql", "uri": catalog_uri, "warehouse": location, **file_io}
    else:
        props = catalog_properties(name, options, file_io)
    with guarded(f"Iceberg catalog {name!r} for {location}", {**store.options, **props}):
        return cache_metadata(load_catalog(name, **props))


@contextmanager
def guarded(what: str, secrets: Mapping[str, Any]) -> Iterator[None]:
    """Run a catalog call: an error other than ours becomes a ConfigError naming ``what``, its text with every
    secret of ``secrets`` (and any password in a URL) masked; pyiceberg's and the drivers' errors may quote the
    catalog's properties, secrets included."""
    try:
        yield
    except MirrorError:
        raise
    except Exception as e:  # noqa: BLE001 - any client's error; the cause is not chained (it holds the secret)
        shown = {k: v for k, v in secrets.items() if isinstance(v, str)}
        raise ConfigError(mask(f"{what}: {type(e).__name__}: {e}", shown)) from None


def ensure_namespace(catalog, identifier: tuple[str, ...]) -> None:
    """Create the identifier's namespace if the catalog does not have it (catalogs may refuse names: a REST
    catalog's own rules come back as its error)."""
    catalog.create_namespace_if_not_exists(identifier[:-1])


@dataclass
class Where:
    """Where a mirror table is in its catalog. ``catalog``: the pyiceberg catalog (None: the default SQLite file
    is not there yet); ``ident``: the identifier (a named catalog) or None (the default catalog: the table at the
    location in the ``msgstream`` namespace, named after the collection when created); ``create_at``: the
    location to create the table at (None: the catalog chooses); ``name``: the catalog's, for messages."""

    catalog: Any
    ident: tuple[str, ...] | None
    create_at: str | None
    name: str
    secrets: dict[str, Any]


def locate(table: str, *, catalog: str | None = None, catalog_options: Mapping[str, str] | None = None,
           catalog_uri: str | None = None, storage_options: Mapping[str, Any] | None = None,
           create: bool = True) -> Where:
    """The catalog of ``table`` (a location, or with a named catalog ``namespace.table``) and how the table is
    found in it."""
    if catalog_options and not catalog:
        raise ConfigError("catalog options (--catalog-option) configure a named catalog: give --catalog NAME too")
    cat = resolve_catalog(table, name=catalog, options=catalog_options, catalog_uri=catalog_uri,
                          storage_options=storage_options, create=create)
    secrets = dict(getattr(cat, "properties", {}) or {})
    if catalog is None:
        return Where(cat, None, manifest_uri(table), "the default" if not catalog_uri else "the SQL", secrets)
    if is_identifier(table, catalog):
        return Where(cat, table_identifier("", table), None, catalog, secrets)
    return Where(cat, table_identifier(table), manifest_uri(table), catalog, secrets)


def manifest_uri(path: str) -> str:
    """``path`` as a full URI (what manifests and position-delete files name): a local path becomes
    ``file:///abs/path``; a URI stays as it is."""
    loc = uri.parse(path)
    return "file://" + loc.key if loc.kind == "local" else str(path)


def same_location(a: str, b: str) -> bool:
    """Whether two locations (URIs or paths, any trailing ``/``) name one directory."""
    x, y = uri.parse(a), uri.parse(b)
    return (x.kind, x.root, x.key.rstrip("/")) == (y.kind, y.root, y.key.rstrip("/"))
