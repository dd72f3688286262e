"""``output=collections``: the rows of every collection on the channels, one read, each collection's rows as Arrow.

A ``rows`` read has one schema, so it holds one collection. A many-collection reader (the mirror's
``--database`` / ``--collections`` / ``--include`` job) reads the channels once with this output instead: one
output row per piece of one collection's rows (``kind`` ``rows``: the piece as an Arrow IPC stream in
``payload``, its columns those of ``rows`` output: ``op``, the fields the insert carries, the metadata
columns) and one per DDL message (``kind`` ``create`` with the serialized ``CollectionSchema`` in ``payload``;
``alter``, a 2.6 AlterCollection / SchemaChange, with the new schema; ``drop``; ``drop_partition`` with the
partition id in ``_partition``; ``truncate``, a 2.6 TruncateCollection, its ``rows`` the collection's shard
count its broadcast header names (0: not named); ``rename``, a 2.6.6+ AlterCollection of the name and/or
database, the new ones in ``name`` / ``db``; a DDL row's ``_shard`` is the vchannel its copy was written to: 2.6
writes one copy per vchannel, each at its own time). Decoding stays here, in the
Spark-free read core, column-wise: each collection's rows are built by its own
:class:`~msgstream_spark.source.rows.RowsBuilder` exactly as a ``rows`` read of that collection builds them
(``_seq``, ``_position``, metadata), and the reader of a piece turns it back into Arrow with :func:`unpack`
(no row passes through Python objects).

A piece's schema comes from the message itself (the insert's field data), so a task needs no collection's
schema: a delete piece names its key column ``$key`` (a name Milvus refuses for a field), which :func:`unpack`
renames to the collection's primary key.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from msgstream_spark.errors import DecodeError
from msgstream_spark.msg.types import DeleteMsg, DropPartitionMsg, InsertMsg, MsgType
from msgstream_spark.msg.wal26 import WalMessageType, WalMsg, fields
from msgstream_spark.msg.wal26.envelope import CONTROL_VCHANNEL_SUFFIX
from msgstream_spark.source.rows import RowsBuilder, ddl_fields, rows_arrow_schema

KEY = "$key"  # a delete piece's key column (Milvus field names cannot hold '$' but its own $meta)
KIND_ROWS, KIND_CREATE, KIND_DROP, KIND_ALTER = "rows", "create", "drop", "alter"
KIND_DROP_PARTITION = "drop_partition"  # a DropPartition: its partition id in ``_partition``
KIND_TRUNCATE, KIND_RENAME = "truncate", "rename"  # 2.6.11+ TruncateCollection; 2.6.6+ AlterCollection of names
COLLECTIONS_DDL = ("kind string, _collection bigint, name string, db string, _ts bigint, rows bigint, "
                   "payload binary, _partition bigint, _shard string")
_RENAME_PATHS = frozenset({"collection_name", "db"})  # AlterCollection update_mask paths of a rename
_ALTER_NAMES = {1: ("updates", {2: ("db_name", "string"), 3: ("collection_name", "string")})}
_TYPES = {"string": pa.string(), "bigint": pa.int64(), "binary": pa.binary()}


def collections_arrow_schema() -> pa.Schema:
    """The Arrow schema of ``collections`` output."""
    return pa.schema([pa.field(n, _TYPES[t]) for n, t in ddl_fields(COLLECTIONS_DDL)])


def _ddl_names(msg: Any) -> tuple[str, str]:
    """(collection name, database name) a CreateCollection / DropCollection names: 2.3-2.6.5 leave the request's
    name empty (the name is in the schema) and carry no database name."""
    p = msg.proto
    name = getattr(p, "collectionName", "") or ""
    if not name and msg.msg_type == MsgType.CreateCollection and msg.schema is not None:
        name = msg.schema.name
    return name, getattr(p, "db_name", "") or ""


def renamed(msg: WalMsg) -> tuple[str, str] | None:
    """(new name, new database: "" when unchanged) of a 2.6.6+ AlterCollection whose ``update_mask`` names
    ``collection_name`` and/or ``db`` (service-notes §1.3), else None."""
    if msg.wal_type != WalMessageType.AlterCollection:
        return None
    paths = set(((msg.header or {}).get("update_mask") or {}).get("paths") or ())
    if not paths & _RENAME_PATHS:
        return None
    try:
        updates = fields.decode(_ALTER_NAMES, msg.body)["updates"] or {}
    except ValueError as exc:
        raise DecodeError(f"malformed AlterCollection body: {exc}", payload=msg.body) from None
    name = updates.get("collection_name", "") if "collection_name" in paths else ""
    db = updates.get("db_name", "") if "db" in paths else ""
    return (name, db) if name or db else None


def _shard_count(msg: WalMsg) -> int:
    """The collection's number of vchannels (shards) a broadcast names in ``_bh`` (the control vchannel left
    out); 0 when the message carries no broadcast header."""
    bh = msg.wal.broadcast
    return 0 if bh is None else sum(1 for v in bh.vchannels if not v.endswith(CONTROL_VCHANNEL_SUFFIX))


def ddl_shard(msg: Any) -> str:
    """The vchannel a DDL copy was written to (2.6 ``_vc``; "" for a 2.3-2.5 message)."""
    return (msg.wal.vchannel or "") if getattr(msg, "wal", None) is not None else ""


def removal(msg: Any) -> tuple[str, int | None, int] | None:
    """A message that removes rows by itself (service-notes §1.6): ``(KIND_DROP_PARTITION, partition id, 0)`` for a
    DropPartition (2.3-2.5 msgstream, 2.6 WAL), ``(KIND_TRUNCATE, None, shard count)`` for a 2.6.11+
    TruncateCollection copy (the count its broadcast header names, 0 when none); None for any other message.
    Both the ``collections`` output and the ``rows`` output's ``removalRows`` rows come from here."""
    if msg.msg_type == MsgType.DropPartition:
        return (KIND_DROP_PARTITION, msg.partition_id, 0) if isinstance(msg, DropPartitionMsg) else None
    if isinstance(msg, WalMsg) and msg.wal_type == WalMessageType.TruncateCollection:
        return KIND_TRUNCATE, None, _shard_count(msg)
    return None


class CollectionsBuilder:
    """Per read task: a :class:`RowsBuilder` per (collection, piece shape), flushed as ``collections`` rows."""

    def __init__(self, group: str = "", keep: frozenset[int] | None = None) -> None:
        self.group = group
        self.builders: dict[tuple, tuple[RowsBuilder, int, str, str]] = {}
        self.out: list[dict[str, Any]] = []  # DDL rows and flushed pieces, in order
        self.rows = 0
        # ``keep``: the collection ids whose rows are decoded (None: every one); another collection's rows are
        # only counted, flushed as a ``rows`` row with no payload (its name, database and row count)
        self.keep = keep
        self.counted: dict[int, list] = {}  # collection id -> [name, database, rows] of rows not decoded

    def _builder(self, msg: Any, values: dict[str, pa.Array] | None) -> RowsBuilder:
        cid = msg.collection_id
        if isinstance(msg, InsertMsg):
            shape: tuple = tuple((fd.field_name, fd.type) for fd in msg.proto.fields_data)
        else:
            shape = ("delete", msg.proto.primary_keys.WhichOneof("id_field"))
        got = self.builders.get((cid, shape))
        if got is None:
            if values is not None:  # the types of the insert's columns, decoded once (``add`` uses them too)
                fields = [pa.field(fd.field_name, values[fd.field_name].type) for fd in msg.proto.fields_data]
                pk = None
            else:
                fields = [pa.field(KEY, pa.string() if shape[1] == "str_id" else pa.int64())]
                pk = KEY
            got = (RowsBuilder(rows_arrow_schema(fields), self.group, pk), cid, msg.proto.collection_name,
                   msg.proto.db_name)
            self.builders[(cid, shape)] = got
        return got[0]

    def add(self, msg: Any, channel: str, msg_id: bytes, position: Any = None) -> None:
        """The rows of one insert or delete (``RowsBuilder.add``), into its collection's builder."""
        if not isinstance(msg, (InsertMsg, DeleteMsg)):
            return
        if self.keep is not None and msg.collection_id not in self.keep:
            return self._count(msg)
        values = msg.field_arrays() if isinstance(msg, InsertMsg) else None
        b = self._builder(msg, values)
        before = b.rows
        b.add(msg, channel, msg_id, position, values)
        self.rows += b.rows - before

    def _count(self, msg: Any) -> None:
        """The rows of an insert or delete of a collection not kept: counted, not decoded."""
        n = msg.num_rows if isinstance(msg, InsertMsg) else len(msg.primary_keys)
        if n:
            p = msg.proto
            c = self.counted.setdefault(msg.collection_id, ["", "", 0])
            c[0] = c[0] or p.collection_name or ""
            c[1] = max(c[1], p.db_name or "")
            c[2] += n

    def ddl(self, msg: Any) -> None:
        """A CreateCollection (its schema), a 2.6 AlterCollection / SchemaChange with a schema (the new one) or a
        new name, a DropCollection, a DropPartition, a 2.6 TruncateCollection: after the rows read before it."""
        removes = removal(msg)
        if removes is not None:
            kind, pid, shards = removes
            return self._ddl_row(msg, kind, "", "", None, pid, rows=shards)
        if msg.msg_type == MsgType.DropPartition:
            return
        kind = {MsgType.CreateCollection: KIND_CREATE, MsgType.DropCollection: KIND_DROP}.get(msg.msg_type)
        if kind is None and isinstance(msg, WalMsg):
            kind = KIND_ALTER  # a 2.6 AlterCollection / SchemaChange (the full new schema)
            names = renamed(msg)
            if names is not None:
                self._ddl_row(msg, KIND_RENAME, names[0], names[1], None)
        if kind is None:
            return
        schema = msg.schema if kind != KIND_DROP else None
        if kind == KIND_ALTER and schema is None:
            return  # an AlterCollection of properties or description only
        name, db = _ddl_names(msg) if kind != KIND_ALTER else (schema.name, "")
        self._ddl_row(msg, kind, name, db, schema.SerializeToString() if schema is not None else None)

    def _ddl_row(self, msg: Any, kind: str, name: str, db: str, payload: bytes | None, partition: int | None = None,
                 rows: int = 0) -> None:
        self._pieces()  # the rows read before it come first
        self.out.append((kind, msg.collection_id, name, db, msg.timestamp, rows, payload, partition, ddl_shard(msg)))

    def _pieces(self) -> None:
        for b, cid, name, db in self.builders.values():
            for batch in b.flush():  # the batch itself: written as an IPC stream into the output's buffer
                self.out.append((KIND_ROWS, cid, name, db, None, batch.num_rows, batch, None, None))
        for cid, (name, db, n) in self.counted.items():  # rows not kept: their count, no payload
            self.out.append((KIND_ROWS, cid, name, db, None, n, None, None, None))
        self.counted = {}

    def flush(self) -> list[pa.RecordBatch]:
        self._pieces()
        out, self.out, self.rows = self.out, [], 0
        if not out:
            return []
        return [_rows_batch(out)]


_PAYLOAD = 6  # a pending output row's payload (DDL bytes, a piece's RecordBatch, None)


def _rows_batch(out: list[tuple]) -> pa.RecordBatch:
    """The pending output rows as one ``collections`` batch, column-wise: the pieces' IPC streams written one after
    another into one buffer of their exact size (measured first: a growing buffer's copies and fresh pages cost
    ~10x the writes), which is the ``payload`` column's data (no copy of a piece into Python bytes)."""
    sizes = np.zeros(len(out) + 1, dtype=np.int64)
    for i, row in enumerate(out):
        p = row[_PAYLOAD]
        if isinstance(p, pa.RecordBatch):
            sizes[i + 1] = _write_piece(pa.MockOutputStream(), p)
        elif p is not None:
            sizes[i + 1] = len(p)
    offsets = np.cumsum(sizes)
    if offsets[-1] >= 2 ** 31:
        raise DecodeError(f"a read task's collections batch holds {offsets[-1]} bytes of pieces, more than a binary "
                          "column takes (2 GiB): read with a smaller maxRecordsPerPartition")
    data = pa.allocate_buffer(int(offsets[-1]))
    sink = pa.FixedSizeBufferWriter(data)
    for row in out:
        p = row[_PAYLOAD]
        if isinstance(p, pa.RecordBatch):
            _write_piece(sink, p)
        elif p is not None:
            sink.write(p)
    valid = np.array([row[_PAYLOAD] is not None for row in out], dtype=bool)
    payload = pa.Array.from_buffers(pa.binary(), len(out), [None if valid.all() else pa.array(valid).buffers()[1],
                                                           pa.py_buffer(offsets.astype(np.int32)), data],
                                    null_count=int((~valid).sum()))
    schema = collections_arrow_schema()
    cols = [payload if j == _PAYLOAD else pa.array([r[j] for r in out], f.type) for j, f in enumerate(schema)]
    return pa.RecordBatch.from_arrays(cols, schema=schema)


def _write_piece(sink: Any, batch: pa.RecordBatch) -> int:
    """``batch`` as an Arrow IPC stream into ``sink``; its bytes."""
    before = sink.tell()
    with pa.ipc.new_stream(sink, batch.schema) as w:
        w.write_batch(batch)
    return sink.tell() - before


def unpack(payloads: list[bytes], schema: pa.Schema, pk: str, min_ts: int | None = None) -> pa.Table:
    """The pieces of one collection (``payload`` of its ``rows`` rows) as one table of ``schema`` (the
    collection's ``rows`` schema): columns a piece lacks are null (a delete's fields, a function output
    Milvus computes later), its ``$key`` is ``pk``; rows at or before ``min_ts`` (a snapshot's time) are left out."""
    parts = []
    for p in payloads:
        t = pa.ipc.open_stream(p).read_all()
        if KEY in t.column_names:
            t = t.rename_columns([pk if n == KEY else n for n in t.column_names])
        cols = [t.column(f.name).cast(f.type) if f.name in t.column_names else pa.nulls(t.num_rows, f.type)
                for f in schema]
        parts.append(pa.Table.from_arrays(cols, schema=schema))
    out = pa.concat_tables(parts) if parts else schema.empty_table()
    if min_ts is not None and out.num_rows:
        out = out.filter(pc.greater(out.column("_ts"), pa.scalar(min_ts, pa.int64())))
    return out
