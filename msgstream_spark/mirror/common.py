"""What the table formats share: the table's columns, its identity properties, schema checks."""

from __future__ import annotations

import pyarrow as pa

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.collapse import OP
from msgstream_spark.mirror.order import SEQ, SEQ_TYPE
from msgstream_spark.mirror.store import LeaseLost
from msgstream_spark.source.rows import METADATA as ROW_METADATA

TS = "_ts"
PARTITION = "_partition"
META_COLUMNS = (TS, SEQ, PARTITION)
# what the source's rows output adds to the fields (op and its metadata columns): never a table field; a user
# field whose name merely starts with "_" (Milvus accepts "_tag") is one
NOT_FIELDS = frozenset({OP, *ROW_METADATA})
# table properties (Delta: metaData.configuration; Iceberg: table properties)
PROP_COLLECTION = "msgstream.collection"
PROP_COLLECTION_ID = "msgstream.collection_id"
PROP_PK = "msgstream.pk"
PROP_PREFIX = "msgstream."
# the snapshot's timestamp S (set by whoever wrote the snapshot): changes at or before S are in it
PROP_SNAPSHOT_TS = "msgstream.snapshot_ts"
# snapshot/commit properties of every merge
PROP_QUERY = "msgstream.query_id"
PROP_BATCH = "msgstream.batch_id"
# the epoch of the newest writer that published one in the table (Delta: a txn action of this app id; Iceberg: a
# table property, set by a snapshot of its own): a commit of a writer with a lower epoch is refused
PROP_WRITER_EPOCH = "msgstream.writer_epoch"


def table_schema(fields: pa.Schema, pk: str) -> pa.Schema:
    """The table's schema: the collection's fields (pk non-null) + ``_ts``, ``_seq``, ``_partition``."""
    if pk not in fields.names:
        raise MirrorError(f"primary key {pk!r} is not one of the fields {fields.names}")
    out = [f.with_nullable(False) if f.name == pk else f for f in fields if f.name not in NOT_FIELDS]
    out += [pa.field(TS, pa.int64(), False), pa.field(SEQ, SEQ_TYPE, False), pa.field(PARTITION, pa.int64(), True)]
    return pa.schema(out)


def identity_properties(collection: str, pk: str, collection_id: int | None) -> dict[str, str]:
    props = {PROP_COLLECTION: collection, PROP_PK: pk}
    if collection_id is not None:
        props[PROP_COLLECTION_ID] = str(int(collection_id))
    return props


def check_identity(location: str, props: dict[str, str], collection: str, pk: str,
                   collection_id: int | None) -> None:
    """MirrorError if the table at ``location`` belongs to another collection."""
    have = (props.get(PROP_COLLECTION), props.get(PROP_PK))
    if have != (collection, pk):
        raise MirrorError(f"table {location} mirrors collection {have[0]!r} (primary key {have[1]!r}), "
                          f"not collection {collection!r} (primary key {pk!r}); nothing written")
    tid = props.get(PROP_COLLECTION_ID)
    if collection_id is not None and tid is not None and int(tid) != int(collection_id):
        raise MirrorError(f"table {location} mirrors collection {collection!r} with id {tid}, but {collection!r} "
                          f"now has id {collection_id} (dropped and re-created): mirror it into a new table; "
                          "nothing written")


def _same_type(a: pa.DataType, b: pa.DataType) -> bool:
    norm = {pa.large_string(): pa.string(), pa.large_binary(): pa.binary()}
    a, b = norm.get(a, a), norm.get(b, b)
    if a == b:
        return True
    if pa.types.is_signed_integer(a) and pa.types.is_signed_integer(b) and a.bit_width >= b.bit_width:
        return True  # Iceberg has no int8/int16: the table keeps Int8/Int16 fields as int32
    if pa.types.is_list(a) or pa.types.is_large_list(a) or pa.types.is_fixed_size_list(a):
        if pa.types.is_list(b) or pa.types.is_large_list(b) or pa.types.is_fixed_size_list(b):
            return _same_type(a.value_type, b.value_type)
    return False


def schema_difference(location: str, collection: str, have: pa.Schema, want: pa.Schema) -> list[pa.Field]:
    """The fields of ``want`` that ``have`` lacks (to add); MirrorError if a shared column changed type
    or a column of the table is not in ``want`` (a schema of another collection)."""
    problems = []
    for f in have:
        if f.name not in want.names:
            problems.append(f"column {f.name!r} ({f.type}) is not a field of {collection!r}")
        elif not _same_type(f.type, want.field(f.name).type):
            problems.append(f"column {f.name!r} is {f.type} in the table, {want.field(f.name).type} in {collection!r}")
    if problems:
        raise MirrorError(f"table {location} does not have the schema of collection {collection!r}: "
                          + "; ".join(problems) + "; nothing written")
    return [want.field(n).with_nullable(True) for n in want.names if n not in have.names]


def new_fields(collapsed: pa.Table, schema: pa.Schema) -> list[pa.Field]:
    """The collection fields a batch of changes carries that the table's ``schema`` lacks (a field added by
    a 2.6 AlterCollection), without ``op`` and the metadata columns."""
    return [f for f in collapsed.schema if f.name not in schema.names and f.name not in NOT_FIELDS]


def conform(collapsed: pa.Table, schema: pa.Schema) -> pa.Table:
    """``collapsed`` with the table's columns (in its order and types); columns the batch lacks are null."""
    cols = []
    for f in schema:
        if f.name in collapsed.column_names:
            col = collapsed.column(f.name)
            cols.append(col if col.type == f.type else col.cast(f.type))
        else:
            cols.append(pa.nulls(collapsed.num_rows, f.type))
    return pa.Table.from_arrays(cols, schema=schema)


def check_prefix(properties: dict[str, str]) -> None:
    bad = [k for k in properties if not k.startswith(PROP_PREFIX)]
    if bad:
        raise MirrorError(f"table properties must start with {PROP_PREFIX!r}: {bad}")


def check_epoch(location: str, have: int, mine: int | None, what: str) -> None:
    """LeaseLost (a MirrorError; nothing committed) if the table's writer epoch ``have`` is above this writer's
    ``mine`` (None: not checked): a later writer took the table over and may have deleted what this one wrote."""
    if mine is not None and have > mine:
        raise LeaseLost(f"table {location}: another writer took the table over (its writer epoch {have} is above "
                        f"this writer's {mine}: this writer's lease was taken over while it stalled or lost the "
                        f"store); {what} refused, nothing committed")
