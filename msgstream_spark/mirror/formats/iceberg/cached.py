"""What pyiceberg recomputes or re-reads that the mirror's commits need only once (issue #44: the database job
commits up to every table of a database per batch, one after another in its driver).

- :func:`transaction`: a pyiceberg ``Transaction`` whose ``table_metadata`` (the table's metadata with the
  transaction's updates applied: pyiceberg rebuilds it, a deep copy of every snapshot, at each of its ~16
  accesses in a commit) is rebuilt only when the table's metadata or the updates changed.
- :func:`cache_metadata`: a SQL catalog that keeps the metadata it read or wrote per metadata file (a metadata file
  never changes: a new one is written at each commit), so loading a table whose catalog row still names the same
  file (``Table.refresh``, and the catalog's own load at each commit) reads one row, not the file. What the
  catalog row names is read every time: another writer's commit is seen as before, and a commit is still
  refused by the catalog when the row moved since (our fencing, ``commit.py``).

Both build on pyiceberg's private API (``Transaction._updates``, ``SqlCatalog._convert_orm_to_iceberg`` and
``_load_file_io``), pinned by ``pyiceberg>=0.12,<0.13`` as ``commit.py``'s is.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

KEPT = 64  # metadata files a catalog keeps parsed (two per table cover a database job's tables between batches)

_TYPES: dict[str, type] = {}


def transaction(tbl) -> Any:
    """A transaction on pyiceberg table ``tbl`` (as ``tbl.transaction()``) whose ``table_metadata`` is built once
    per change of the table's metadata or of the staged updates."""
    return _transaction_type()(tbl)


def _transaction_type() -> type:
    if "tx" in _TYPES:
        return _TYPES["tx"]
    from pyiceberg.table import Transaction

    class CachedTransaction(Transaction):
        _built: tuple | None = None  # (the table's metadata, the updates, what they make)

        @property
        def table_metadata(self):
            got = self._built
            base, updates = self._table.metadata, self._updates
            if got is None or got[0] is not base or got[1] is not updates:
                got = self._built = (base, updates, super().table_metadata)
            return got[2]

    _TYPES["tx"] = CachedTransaction
    return CachedTransaction


def cache_metadata(catalog) -> Any:
    """``catalog`` (returned) keeping up to ``KEPT`` tables' metadata parsed by metadata file, if it is a pyiceberg
    SQL catalog (another kind is returned as it is: a REST catalog answers a load with the metadata itself)."""
    from pyiceberg.catalog.sql import SqlCatalog

    if not isinstance(catalog, SqlCatalog) or getattr(catalog, "_msgstream_parsed", None) is not None:
        return catalog
    parsed: OrderedDict[str, Any] = OrderedDict()  # metadata file -> its metadata
    lock = threading.Lock()
    catalog._msgstream_parsed = parsed
    convert, commit = catalog._convert_orm_to_iceberg, catalog.commit_table

    def keep(location: str, metadata) -> None:
        with lock:
            parsed[location] = metadata
            parsed.move_to_end(location)
            while len(parsed) > KEPT:
                parsed.popitem(last=False)

    def convert_orm(orm_table):
        from pyiceberg.catalog import Catalog
        from pyiceberg.table import Table

        location = orm_table.metadata_location
        with lock:
            got = parsed.get(location) if location else None
        if got is None or not orm_table.table_namespace or not orm_table.table_name:
            tbl = convert(orm_table)
            keep(tbl.metadata_location, tbl.metadata)
            return tbl
        return Table(identifier=Catalog.identifier_to_tuple(orm_table.table_namespace) + (orm_table.table_name,),
                     metadata=got, metadata_location=location, io=catalog._load_file_io(got.properties, location),
                     catalog=catalog)

    def commit_table(table, requirements, updates):
        response = commit(table, requirements, updates)
        keep(response.metadata_location, response.metadata)
        return response

    catalog._convert_orm_to_iceberg = convert_orm
    catalog.commit_table = commit_table
    return catalog


LISTS_KEPT = 256  # manifest lists kept read (a database job's tables' current and previous ones)
_lists: OrderedDict[str, tuple] = OrderedDict()  # manifest list -> the manifests it lists
_lists_lock = threading.Lock()


def manifests(snap, io) -> tuple:
    """The manifests snapshot ``snap`` lists, its manifest list read once in this process (a manifest list never
    changes; pyiceberg reads it again at every ``Snapshot.manifests``)."""
    path = snap.manifest_list
    with _lists_lock:
        got = _lists.get(path)
        if got is not None:
            _lists.move_to_end(path)
            return got
    got = tuple(snap.manifests(io=io))
    with _lists_lock:
        _lists[path] = got
        while len(_lists) > LISTS_KEPT:
            _lists.popitem(last=False)
    return got
