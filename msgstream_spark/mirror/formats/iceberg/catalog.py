"""Which Iceberg catalog a mirrored table is registered in, configured the way pyiceberg users configure one.

``--catalog NAME`` loads pyiceberg's catalog ``NAME``: its properties from ``.pyiceberg.yaml`` (``PYICEBERG_HOME``,
the home directory, the working directory) and ``PYICEBERG_CATALOG__<NAME>__<KEY>`` variables, overridden by
``--catalog-option KEY=VALUE``; the table's storage settings (``--storage-option`` and the object_store variables)
fill in the FileIO properties the catalog's own configuration leaves out (``s3.endpoint``, ``s3.access-key-id``,
...), so data, manifests and delete files go to the same store as the table. Without a name, today's default:
the SQL catalog on SQLite beside a local table (or the SQL catalog at ``catalog_uri``); a table in object
storage has no disk beside it, so it needs a named catalog or a ``catalog_uri``.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

from msgstream_spark.errors import ConfigError, MirrorError
from msgstream_spark.mirror.formats.iceberg.table import NAMESPACE, _catalog
from msgstream_spark.mirror.store import open_store, uri
from msgstream_spark.mirror.store.settings import mask


def table_identifier(location: str, given: str | None = None) -> tuple[str, ...]:
    """``given`` (``namespace.table``, namespaces may nest: ``a.b.table``) split, or the location's last path
    segment in the ``msgstream`` namespace (``s3://bucket/lake/books`` -> ``("msgstream", "books")``)."""
    if given:
        parts = tuple(p for p in given.split(".") if p)
        if len(parts) < 2:
            raise ConfigError(f"table identifier {given!r}: give it as namespace.table")
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
    from pyiceberg.utils.config import Config

    conf = dict(Config().get_catalog_config(name.lower()) or {})
    if not conf and not (options or {}):
        raise ConfigError(f"Iceberg catalog {name!r} is not configured: no 'catalog: {name}:' entry in "
                          ".pyiceberg.yaml (PYICEBERG_HOME, the home directory or the working directory) and no "
                          f"PYICEBERG_CATALOG__{name.upper()}__<KEY> variables; or give --catalog-option KEY=VALUE")
    return {**{k: v for k, v in (file_io or {}).items() if k not in conf}, **conf, **dict(options or {})}


def resolve_catalog(location: str, *, name: str | None = None, options: Mapping[str, str] | None = None,
                    catalog_uri: str | None = None, storage_options: Mapping[str, Any] | None = None,
                    create: bool = True):
    """The pyiceberg catalog of the table at ``location`` (None: the default SQLite catalog does not exist and
    ``create`` is False; a named catalog creates no namespace: :func:`ensure_namespace`). Errors name the catalog
    and never show a secret."""
    store = open_store(location, storage_options)
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
    try:
        return load_catalog(name, **props)
    except Exception as e:  # noqa: BLE001 - pyiceberg's errors quote the properties, secrets included
        shown = {**store.options, **{k: v for k, v in props.items() if isinstance(v, str)}}
        raise ConfigError(mask(f"Iceberg catalog {name!r} for {location}: {type(e).__name__}: {e}", shown)) from None


def ensure_namespace(catalog, identifier: tuple[str, ...]) -> None:
    """Create the identifier's namespace if the catalog does not have it (catalogs may refuse names: a REST
    catalog's own rules come back as its error)."""
    catalog.create_namespace_if_not_exists(identifier[:-1])
