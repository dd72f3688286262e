"""What pyiceberg recomputes or re-reads that the mirror's commits need only once (issue #44: the database job
commits up to every table of a database per batch, one after another in its driver).

- :func:`transaction`: a pyiceberg ``Transaction`` whose ``table_metadata`` (the table's metadata with the
  transaction's updates applied: pyiceberg rebuilds it, a deep copy of every snapshot, at each of its ~16
  accesses in a commit) is rebuilt only when the table's metadata or the updates changed, and never deep-copied
  (:func:`applied`); the catalog's commit builds the new metadata the same way.
- :func:`cache_metadata`: a SQL catalog that keeps the metadata it read or wrote per metadata file (a metadata file
  never changes: a new one is written at each commit), so loading a table whose catalog row still names the same
  file (``Table.refresh``, and the catalog's own load at each commit) reads one row, not the file. What the
  catalog row names is read every time (one prepared SQL statement, not pyiceberg's ORM query: :func:`row_location`):
  another writer's commit is seen as before, and a commit is still refused by the catalog when the row moved
  since (our fencing, ``commit.py``). A kept metadata file's FileIO is loaded once (pyiceberg: at each load), and
  a commit swaps the row with one prepared compare-and-swap statement (:func:`committed`, :func:`swap_row`; pyiceberg
  built an ORM session and its statement at each commit).

- :func:`manifest_output`: a manifest's Avro file whose schemas (the entry schema with the table's partition type,
  its Avro JSON, the resolved record writer: the same for every manifest of one table schema and partition spec)
  are built once per schema and spec, not at each manifest written.
- :func:`arrow_schema`: a table schema as Arrow, converted once per schema (the table's ``schema``, each write spec:
  ~9 conversions a batch of the database job).
- :func:`manifests`: a snapshot's manifest list read once in this process, and never read at all for a snapshot
  this process committed (:func:`listed`: the commit tells what it wrote).

All build on pyiceberg's private API (``Transaction._updates``, ``_apply_table_update``, the SQL catalog's
``_convert_orm_to_iceberg``, ``_update_and_stage_table`` and ``_load_file_io``, ``ManifestWriter._with_partition``,
``AvroOutputFile._write_header``), pinned by
``pyiceberg>=0.12,<0.13`` as ``commit.py``'s is.
"""

from __future__ import annotations

import json
import os
import threading
from collections import OrderedDict
from datetime import datetime
from typing import Any

from msgstream_spark.mirror.formats.iceberg.manifest_read import list_manifests

KEPT = 16  # metadata files a catalog object keeps parsed (each table opens its own: two a table are what is reused)

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
                got = self._built = (base, updates, applied(base, updates))
            return got[2]

    _TYPES["tx"] = CachedTransaction
    return CachedTransaction


def applied(base, updates: tuple, metadata_location: str | None = None):
    """Table metadata ``base`` with ``updates`` applied, as pyiceberg's ``update_table_metadata`` makes it (its
    per-update steps, its metadata log and timestamp, its checks) but not deep-copied at the end: every step
    makes a new object (``model_copy(update=...)``, new lists and dicts), none changes ``base`` (its models are
    frozen), so what the result shares with ``base`` is never changed. ``metadata_location``: the base's metadata
    file, logged (a catalog's commit)."""
    from pyiceberg.table.update import _apply_table_update, _TableMetadataUpdateContext, _update_table_metadata_log
    from pyiceberg.utils.datetime import datetime_to_millis

    context = _TableMetadataUpdateContext()
    new = base
    for update in updates:
        new = _apply_table_update(update, new, context)
    if context.has_changes():
        if metadata_location:
            new = _update_table_metadata_log(new, metadata_location, base.last_updated_ms)
        if base.last_updated_ms == new.last_updated_ms:
            new = new.model_copy(update={"last_updated_ms": datetime_to_millis(datetime.now().astimezone())})
    new.spec().check_compatible(new.schema())
    new.sort_order().check_compatible(new.schema())
    return new


def cache_metadata(catalog) -> Any:
    """``catalog`` (returned) keeping up to ``KEPT`` tables' metadata parsed by metadata file, if it is a pyiceberg
    SQL catalog (another kind is returned as it is: a REST catalog answers a load with the metadata itself)."""
    from pyiceberg.catalog.sql import SqlCatalog

    if not isinstance(catalog, SqlCatalog) or getattr(catalog, "_msgstream_parsed", None) is not None:
        return catalog
    parsed: OrderedDict[str, list] = OrderedDict()  # metadata file -> [its metadata, its FileIO or None]
    lock = threading.Lock()
    catalog._msgstream_parsed = parsed
    convert, commit = catalog._convert_orm_to_iceberg, catalog.commit_table

    def keep(location: str, metadata) -> None:
        with lock:
            parsed[location] = [metadata, None]
            parsed.move_to_end(location)
            while len(parsed) > KEPT:
                parsed.popitem(last=False)

    def convert_orm(orm_table):
        location = orm_table.metadata_location
        with lock:
            got = parsed.get(location) if location else None
        if got is None or not orm_table.table_namespace or not orm_table.table_name:
            tbl = convert(orm_table)
            keep(tbl.metadata_location, tbl.metadata)
            return tbl
        return _parsed_table(catalog, Catalog.identifier_to_tuple(orm_table.table_namespace) +
                             (orm_table.table_name,), got, location)

    def commit_table(table, requirements, updates):
        response = committed(catalog, table, requirements, updates, load_table)
        if response is None:  # a table's creation, or a database without reliable row counts: pyiceberg's
            response = commit(table, requirements, updates)
        keep(response.metadata_location, response.metadata)
        return response

    def update_and_stage(current_table, table_identifier, requirements, updates):
        if current_table is None:  # a table's creation: pyiceberg's (it validates the new metadata whole)
            return stage(current_table, table_identifier, requirements, updates)
        return staged(catalog, current_table, table_identifier, requirements, updates)

    def load_table(identifier):
        location = row_location(catalog, identifier)
        with lock:
            got = parsed.get(location) if location else None
        if got is None:  # another writer's metadata file (or none, or no such table): pyiceberg's load
            return load(identifier)
        return _parsed_table(catalog, Catalog.identifier_to_tuple(identifier), got, location)

    from pyiceberg.catalog import Catalog

    stage, load = catalog._update_and_stage_table, catalog.load_table
    catalog._convert_orm_to_iceberg = convert_orm
    catalog.commit_table = commit_table
    catalog._update_and_stage_table = update_and_stage
    catalog.load_table = load_table
    return catalog


def _parsed_table(catalog, identifier: tuple, kept: list, location: str) -> Any:
    """A pyiceberg table of ``catalog`` at metadata file ``location``, its metadata already parsed and its FileIO
    loaded once (``kept``: [metadata, FileIO or None], the FileIO set here when first needed; pyiceberg loads one
    at each table load, ~10 a batch of the database job)."""
    from pyiceberg.table import Table

    metadata, io = kept
    if io is None:
        io = kept[1] = catalog._load_file_io(metadata.properties, location)
    return Table(identifier=identifier, metadata=metadata, metadata_location=location, io=io, catalog=catalog)


def row_location(catalog, identifier) -> str | None:
    """The metadata file table ``identifier``'s row in SQL catalog ``catalog`` names now (None: no row), read with
    one SQL statement built once per catalog: the row pyiceberg's ``load_table`` reads (a table's, not a view's),
    without its ORM session and statement built at each call (~0.4 ms of CPU a load; a batch of the database job
    loads each table ~10 times)."""
    from pyiceberg.catalog import Catalog

    stmt = getattr(catalog, "_msgstream_row", None)
    if stmt is None:
        from pyiceberg.catalog.sql import IcebergTables
        from sqlalchemy import bindparam, select

        stmt = select(IcebergTables.metadata_location).where(
            IcebergTables.catalog_name == bindparam("catalog"), IcebergTables.table_namespace == bindparam("ns"),
            IcebergTables.table_name == bindparam("name"))
        if (only_tables := catalog._iceberg_type_filter()) is not None:
            stmt = stmt.where(only_tables)
        catalog._msgstream_row = stmt
    ns = Catalog.namespace_to_string(Catalog.namespace_from(identifier))
    with catalog.engine.connect() as conn:
        return conn.execute(stmt, {"catalog": catalog.name, "ns": ns,
                                   "name": Catalog.table_name_from(identifier)}).scalar()


def committed(catalog, table, requirements, updates, load) -> Any:
    """pyiceberg's ``SqlCatalog.commit_table`` of an existing table (requirements checked, the new metadata file
    written, the catalog row swapped from the current metadata file to the new one: refused with
    ``CommitFailedException`` when the row moved meanwhile), the row swapped by one SQL statement built once per
    catalog (:func:`swap_row`), not an ORM session and statement built per commit. The current metadata is the
    committing table's own, which the transaction's updates were built on (pyiceberg loads the catalog's again:
    one more read of the row a commit), unless it has none (``load``); the swap compares the row with that
    metadata file, so a table that moved since it was read is refused all the same.
    None: not done here (no such table: a creation; a database whose updates do not count rows)."""
    from pyiceberg.exceptions import NoSuchTableError
    from pyiceberg.table import CommitTableResponse, StagedTable

    if not catalog.engine.dialect.supports_sane_rowcount:
        return None
    identifier = table.name()
    # a staged table (a creation's transaction) names the metadata file it is to have, not one the catalog has
    current = table if getattr(table, "metadata_location", None) and not isinstance(table, StagedTable) else None
    try:
        current = current or load(identifier)
    except NoSuchTableError:
        return None
    new = catalog._update_and_stage_table(current, identifier, requirements, updates)
    if new.metadata == current.metadata:  # no change: nothing written (as pyiceberg)
        return CommitTableResponse(metadata=current.metadata, metadata_location=current.metadata_location)
    catalog._write_metadata(metadata=new.metadata, io=new.io, metadata_path=new.metadata_location)
    swap_row(catalog, identifier, current.metadata_location, new.metadata_location)
    return CommitTableResponse(metadata=new.metadata, metadata_location=new.metadata_location)


def swap_row(catalog, identifier, old: str, new: str) -> None:
    """Table ``identifier``'s row in SQL catalog ``catalog`` names metadata file ``new`` (and ``old`` as the
    previous one) if it names ``old`` now, in one transaction; ``CommitFailedException`` if it does not (another
    writer's commit landed since ``old`` was read): pyiceberg's compare-and-swap, its statement built once."""
    from pyiceberg.catalog import Catalog
    from pyiceberg.exceptions import CommitFailedException

    stmt = getattr(catalog, "_msgstream_swap", None)
    if stmt is None:
        from pyiceberg.catalog.sql import IcebergTables
        from sqlalchemy import bindparam, update

        stmt = catalog._msgstream_swap = update(IcebergTables).where(
            IcebergTables.catalog_name == bindparam("catalog"), IcebergTables.table_namespace == bindparam("ns"),
            IcebergTables.table_name == bindparam("name"), IcebergTables.metadata_location == bindparam("old"),
        ).values(metadata_location=bindparam("new"), previous_metadata_location=bindparam("old"))
    ns = Catalog.namespace_to_string(Catalog.namespace_from(identifier))
    name = Catalog.table_name_from(identifier)
    with catalog.engine.begin() as conn:
        n = conn.execute(stmt, {"catalog": catalog.name, "ns": ns, "name": name, "old": old, "new": new}).rowcount
    if n < 1:
        raise CommitFailedException(f"Table has been updated by another process: {ns}.{name}")


def staged(catalog, current, identifier, requirements, updates):
    """pyiceberg's ``_update_and_stage_table`` of an existing table (requirements checked against the catalog's
    current metadata, the updates applied, the next metadata file named), the metadata built by :func:`applied`."""
    from pyiceberg.table import StagedTable
    from pyiceberg.table.locations import load_location_provider

    for requirement in requirements:
        requirement.validate(current.metadata)
    new = applied(current.metadata, updates, current.metadata_location)
    version = catalog._parse_metadata_version(current.metadata_location) + 1
    location = load_location_provider(new.location, new.properties).new_table_metadata_file_location(version)
    return StagedTable(identifier=identifier, metadata=new, metadata_location=location,
                       io=catalog._load_file_io(properties=new.properties, location=location), catalog=catalog)


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
    got = tuple(list_manifests(snap.manifest_list, io))
    with _lists_lock:
        _lists[path] = got
        while len(_lists) > LISTS_KEPT:
            _lists.popitem(last=False)
    return got


def listed(path: str, manifests_written: tuple) -> None:
    """Manifest list ``path`` (one this process just wrote) holds ``manifests_written``, as the list's writer
    prepared them (sequence numbers assigned): :func:`manifests` of its snapshot reads no file."""
    with _lists_lock:
        _lists[path] = manifests_written
        _lists.move_to_end(path)
        while len(_lists) > LISTS_KEPT:
            _lists.popitem(last=False)


SCHEMAS_KEPT = 64  # (table schema, partition spec) pairs whose manifest schemas are kept built
_schemas: OrderedDict[tuple, tuple] = OrderedDict()


def manifest_output(writer) -> Any:
    """The Avro file of pyiceberg manifest writer ``writer`` (its ``new_writer``), its schemas built once per
    (format version, table schema, partition spec): the manifest entry schemas (the file's and the records'),
    the file schema's Avro JSON and the records' writer, none of which holds per-file state."""
    from pyiceberg.avro.resolver import resolve_writer
    from pyiceberg.manifest import DEFAULT_READ_VERSION
    from pyiceberg.utils.schema_conversion import AvroSchemaConversion

    meta = writer._meta
    key = (writer.version, meta["schema"], meta["partition-spec"])
    with _lists_lock:
        got = _schemas.get(key)
    if got is None:
        file_schema = writer._with_partition(writer.version)
        record_schema = writer._with_partition(DEFAULT_READ_VERSION)
        avro = json.dumps(AvroSchemaConversion().iceberg_to_avro(file_schema, schema_name="manifest_entry"))
        got = (file_schema, resolve_writer(record_schema=record_schema, file_schema=file_schema), avro)
        with _lists_lock:
            _schemas[key] = got
            while len(_schemas) > SCHEMAS_KEPT:
                _schemas.popitem(last=False)
    return known_schema_output(writer._output_file, got, meta)


def known_schema_output(output_file, built: tuple, metadata: dict[str, str]) -> Any:
    """pyiceberg's Avro output file (an ``AvroOutputFile``, not yet entered) of ``output_file``, given its schema's
    parts built: (file schema, record writer, the file schema's Avro JSON); ``metadata``: the header's."""
    return _output_type()(output_file, built, metadata)


def _output_type() -> type:
    if "output" in _TYPES:
        return _TYPES["output"]
    from pyiceberg.avro.codecs import AVRO_CODEC_KEY, CODEC_MAPPING_ICEBERG_TO_AVRO
    from pyiceberg.avro.file import _SCHEMA_KEY, MAGIC, META_SCHEMA, SYNC_SIZE, AvroFileHeader, AvroOutputFile
    from pyiceberg.avro.resolver import construct_writer
    from pyiceberg.table import TableProperties

    header_writer = construct_writer(META_SCHEMA)

    class KnownSchemaOutput(AvroOutputFile):
        """pyiceberg's Avro output file, given its schema's parts built (``manifest_output``)."""

        def __init__(self, output_file, built: tuple, metadata: dict[str, str]) -> None:
            self.output_file, self.schema_name, self.metadata = output_file, "manifest_entry", metadata
            self.file_schema, self.writer, self._avro = built
            self.sync_bytes = os.urandom(SYNC_SIZE)

        def _write_header(self) -> None:
            """The header pyiceberg writes (the metadata, the schema's Avro JSON, the codec's Avro name)."""
            codec = self.metadata.get(AVRO_CODEC_KEY, TableProperties.WRITE_AVRO_COMPRESSION_DEFAULT)
            codec = CODEC_MAPPING_ICEBERG_TO_AVRO.get(codec) or codec
            meta = {**self.metadata, _SCHEMA_KEY: self._avro, AVRO_CODEC_KEY: codec}
            header_writer.write(self.encoder, AvroFileHeader(MAGIC, meta, self.sync_bytes))

    _TYPES["output"] = KnownSchemaOutput
    return KnownSchemaOutput


ARROW_KEPT = 64  # table schemas kept converted to Arrow
_arrow: OrderedDict[int, tuple] = OrderedDict()  # id of a pyiceberg schema -> (the schema, its Arrow schema)


def arrow_schema(schema) -> Any:
    """pyiceberg ``schema`` as an Arrow schema with field ids (pyiceberg's ``schema_to_pyarrow``), converted once
    per schema object (a pyiceberg schema is frozen; one kept here is kept alive, so its id is not reused)."""
    from pyiceberg.io.pyarrow import schema_to_pyarrow

    with _lists_lock:
        got = _arrow.get(id(schema))
    if got is not None and got[0] is schema:
        return got[1]
    out = schema_to_pyarrow(schema, include_field_ids=True)
    with _lists_lock:
        _arrow[id(schema)] = (schema, out)
        while len(_arrow) > ARROW_KEPT:
            _arrow.popitem(last=False)
    return out
