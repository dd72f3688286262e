"""The catalog half of an Iceberg mirror table: which catalog, which of its tables (by location or by
identifier), created how, and the table's store (``catalog.py`` resolves the catalog; ``table.py`` is the rest).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import pyarrow as pa

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.common import identity_properties
from msgstream_spark.mirror.formats.base import LiveFile
from msgstream_spark.mirror.formats.detect import refuse_occupied
from msgstream_spark.mirror.formats.iceberg.catalog import (
    NAMESPACE,
    Where,
    _catalog,
    _catalog_uri,
    _identifier,
    ensure_namespace,
    guarded,
    manifest_uri,
    same_location,
)
from msgstream_spark.mirror.formats.iceberg.files import read_position_deletes
from msgstream_spark.mirror.store import Store, open_store, uri


class CatalogTable:
    """An Iceberg table mirroring one collection: at ``location`` (a path or URI), or named by identifier in a
    named catalog (``location`` is then the catalog's, once the table exists); ``store``: the table's store."""

    def __init__(self, location: str, collection: str, pk: str, collection_id: int | None, where: Where,
                 storage_options: Mapping[str, Any] | None = None, catalog_uri: str | None = None) -> None:
        self.collection = collection
        self.pk = pk
        self.collection_id = collection_id
        self._where = where
        self._catalog = where.catalog
        self._catalog_uri = catalog_uri
        self._storage = storage_options
        self._tbl = None
        self._bind(location)
        self._deletes: dict[str, dict[str, np.ndarray]] = {}
        self._live: list[LiveFile] = []
        self._names: dict[str, str] = {}  # live data file (the store's spelling) -> as its manifest names it
        self._entries: dict[str, list] = {}  # manifest path -> its live entries' data files (read once)
        self._pinned = self._looked = False  # a batch's one read of the catalog (pin_log): asked for, made

    def _store_for(self, path: str) -> Store:
        """The store a file is read through: the table's, or for a file outside it (the snapshot's files of a
        table the catalog has not placed yet, another bucket) one opened on the file with the table's settings."""
        a, b = uri.parse(path), uri.parse(self.store.root)
        return self.store if (a.kind, a.root) == (b.kind, b.root) else open_store(path, self._storage)

    def _positions(self, delete_file: str) -> dict[str, np.ndarray]:
        """Data file path -> positions of one position-delete file (cached: delete files never change)."""
        got = self._deletes.get(delete_file)
        if got is None:
            got = self._deletes[delete_file] = read_position_deletes(self._store_for(delete_file), delete_file)
        return got

    def _named(self, path: str) -> str:
        """A data file as its manifest names it (a live file's own spelling; a new file: its full URI)."""
        return self._names.get(path) or manifest_uri(path)

    def _bind(self, location: str) -> None:
        """Point the table at ``location`` (as given, or the catalog's): its store and root."""
        self.location = location
        self.store = open_store(location, self._storage)
        self.root = uri.join(location)

    def _find(self):
        """The catalog's table: by identifier (a named catalog; given as a location, it must be there), or the
        default catalog's table at this location (whatever its name); None: there is none."""
        from pyiceberg.exceptions import NoSuchNamespaceError, NoSuchTableError

        what = f"{self._where.name} catalog's table {self.location}"
        if self._where.ident is None:
            with guarded(f"reading {what}", self._where.secrets):
                try:
                    return self._at_location()
                except NoSuchNamespaceError:
                    return None
        with guarded(f"reading {what}", self._where.secrets):
            try:
                tbl = self._catalog.load_table(self._where.ident)
            except (NoSuchTableError, NoSuchNamespaceError):
                return None
        name = ".".join(self._where.ident)
        if self._where.create_at is None:  # named by identifier: the table lives where the catalog says
            self._bind(_plain(tbl.location()))
        elif not same_location(tbl.location(), self.location):
            raise MirrorError(f"catalog {self._where.name!r} has table {name} at {tbl.location()}, not at "
                              f"{self.location}: give --table {name} to mirror into that table, or another location")
        return tbl

    def _at_location(self):
        """The default catalog's table stored at this location (whatever its name), or None."""
        for ident in self._catalog.list_tables(NAMESPACE):
            tbl = self._catalog.load_table(ident)
            if same_location(tbl.location(), self.location):
                return tbl
        return None

    def _create(self, schema: pa.Schema, properties: dict[str, str]) -> None:
        props = {**identity_properties(self.collection, self.pk, self.collection_id), **properties}
        ident = self._creating()
        at = {} if self._where.create_at is None else {"location": self._where.create_at}
        from pyiceberg.exceptions import TableAlreadyExistsError

        name = ".".join(ident)
        with guarded(f"creating table {name} in {self._where.name} catalog", self._where.secrets):
            try:
                self._tbl = self._catalog.create_table(ident, schema=schema, properties=props, **at)
            except TableAlreadyExistsError as e:
                raise MirrorError(f"table {name} was created by another writer at the same time (in "
                                  f"{self._where.name} catalog): nothing written; run again to use it") from e
        if self._where.create_at is None:
            self._bind(_plain(self._tbl.location()))

    def _creating(self) -> tuple[str, ...]:
        """The identifier of the table about to be created, its namespace made if the catalog lacks it (a named
        catalog's, or the default ``msgstream`` one in a new SQL catalog given by ``catalog_uri``); refused if the
        location already holds a table (:meth:`_check_free`)."""
        self._check_free()
        if self._catalog is None:
            self._catalog = self._where.catalog = _catalog(self.location, self._catalog_uri)
        ident = _identifier(self.collection) if self._where.ident is None else self._where.ident
        with guarded(f"creating namespace {'.'.join(ident[:-1])} in {self._where.name} catalog", self._where.secrets):
            ensure_namespace(self._catalog, ident)
        return ident

    def _check_free(self) -> None:
        """Before a table this catalog does not have is made at the location (now, or by ``add_files``): a
        MirrorError if the location already holds one (another catalog's Iceberg table, a Delta table), as two
        tables at one location delete each other's files. (A catalog that places the table itself keeps them
        apart.)"""
        if self._where.create_at is not None:
            refuse_occupied(self.store, self.location, "iceberg", self._catalog_named())

    def _catalog_named(self) -> str:
        """The catalog, for messages (no URI that may hold a password)."""
        if self._where.name == "the default":
            return f"the default catalog ({_catalog_uri(uri.parse(self.location).key, None)})"
        if self._where.name == "the SQL":
            return "the SQL catalog of catalog_uri (--catalog-uri)"
        return f"catalog {self._where.name!r}"

    def pin_log(self, pinned: bool = True) -> None:
        """A batch begins (``pinned``): the catalog's table is read once (at the next read) and every read until
        its end (False) answers from that read and this writer's own commits (pyiceberg's handle takes the
        metadata each commit made); outside a batch each read reads the catalog. The batch's commit reads it
        again for its checks, and the catalog refuses a commit whose table moved since its plan either way."""
        self._pinned, self._looked = pinned, False

    def _fresh(self):
        """The catalog's table as it is now (in a pinned batch: as the batch's one read found it)."""
        tbl = self._table()
        if not (self._pinned and self._looked):
            tbl.refresh()
            self._looked = self._pinned
        return tbl

    def _table(self):
        if self._tbl is None:
            raise MirrorError(f"no Iceberg table for {self.collection!r} at {self.location}")
        return self._tbl


def _plain(location: str) -> str:
    """A catalog's table location as the mirror names it: a local one as a plain path (as a local table given by
    its path is), a URI as it is."""
    loc = uri.parse(location)
    return loc.key if loc.kind == "local" else location
