"""Decoded messages -> Arrow record batches of the source's schema, column-wise.

``rows`` output: one row per inserted row and per deleted key, the collection's fields
plus metadata columns. ``messages`` output: one row per message, undecoded payload.
Per message the work is a handful of Arrow calls; nothing loops over rows in Python.
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np
import pyarrow as pa

from msgstream_spark.errors import DecodeError
from msgstream_spark.msg import codec
from msgstream_spark.msg.position import MsgPosition
from msgstream_spark.msg.seq import SEQ, SEQ_DDL, SEQ_TYPE, seq_array
from msgstream_spark.msg.structs import rebuild_structs, struct_targets
from msgstream_spark.msg.types import DeleteMsg, InsertMsg, MsgType, TsMsg
from msgstream_spark.msg.wal26 import is_wal_message, parse_envelope
from msgstream_spark.source.offsets import b64

log = logging.getLogger(__name__)

OP = "op"
METADATA = ("_channel", "_shard", "_collection", "_partition", "_ts", "_event_time", "_msg_id", "_position", SEQ)
METADATA_DDL = ("_channel string, _shard string, _collection bigint, _partition bigint, _ts bigint, "
                f"_event_time timestamp, _msg_id binary, _position string, {SEQ} {SEQ_DDL}")
MESSAGES_DDL = ("channel string, msg_id binary, position string, msg_type string, timestamp bigint, "
                "begin_ts bigint, end_ts bigint, event_time timestamp, collection_id bigint, shard string, "
                "num_rows bigint, properties map<string,string>, payload binary, "
                "version int, vchannel string, txn_id bigint, broadcast_id bigint")


# The fixed columns as Arrow types (what Spark's types of the DDL above map to, field by field).
_ARROW = {"string": pa.string(), "bigint": pa.int64(), "int": pa.int32(), "timestamp": pa.timestamp("us", tz="UTC"),
          "binary": pa.binary(), "map<string,string>": pa.map_(pa.string(), pa.string()), SEQ_DDL: SEQ_TYPE}


def ddl_fields(ddl_like: str) -> list[tuple[str, str]]:
    """(name, type) of our fixed 'name type, ...' lists."""
    return [tuple(part.split(" ", 1)) for part in ddl_like.split(", ")]  # type: ignore[misc]


def _arrow_fields(ddl_like: str) -> list[pa.Field]:
    return [pa.field(name, _ARROW[typ], nullable=True) for name, typ in ddl_fields(ddl_like)]


def rows_arrow_schema(collection_fields: pa.Schema | list[pa.Field]) -> pa.Schema:
    """op + the collection's fields + metadata columns: the Arrow schema of ``rows`` output."""
    fields = [pa.field(f.name, f.type, nullable=True) for f in collection_fields]
    return pa.schema([pa.field(OP, pa.string(), nullable=True), *fields, *_arrow_fields(METADATA_DDL)])


def messages_arrow_schema() -> pa.Schema:
    """The Arrow schema of ``messages`` output."""
    return pa.schema(_arrow_fields(MESSAGES_DDL))


def _ddl_columns(ddl: str) -> list[str]:
    """The column definitions of a Spark DDL list, split at top-level commas."""
    out, depth, cur = [], 0, []
    for ch in ddl:
        if ch in "<(":
            depth += 1
        elif ch in ">)":
            depth -= 1
        if ch == "," and depth == 0:
            out.append("".join(cur).strip())
            cur = []
        else:
            cur.append(ch)
    out.append("".join(cur).strip())
    return [c for c in out if c]


def rows_schema_ddl(field_ddl: str) -> str:
    """The rows schema for a user's ``schema`` option: ``op``, the fields, the metadata columns.

    Columns the source adds itself (``op``, ``_channel``, ...) are dropped from the user's list, so a
    schema copied from a DataFrame this source produced works instead of repeating a column (which
    made Spark fail reading the Arrow batches with an IndexOutOfBoundsException).
    """
    reserved = {OP, *METADATA}
    fields = [c for c in _ddl_columns(field_ddl) if c.split(None, 1)[0].strip("`").lower() not in reserved]
    return ", ".join([f"{OP} string", *fields, METADATA_DDL])


def resume_position(channel: str, msg_id: bytes, begin_ts: int, group: str = "") -> str:
    """Base64 MsgPosition that resumes AT this message (Milvus seek: drop BeginTs <= ts)."""
    return MsgPosition(channel, msg_id, group, max(0, int(begin_ts) - 1)).to_base64()


_RECURRING = frozenset({OP, "_channel", "_shard", "_collection", "_partition"})


_EVENT_TIME = pa.timestamp("us", tz="UTC")


def _event_time(ts: np.ndarray) -> pa.Array:
    """Microseconds of the hybrid timestamps' physical part, wrapped as Arrow's buffer without a conversion pass
    (``pa.array(us, timestamp type)`` checks and converts every value: 3x the cost)."""
    us = (ts.view(np.int64) >> 18) * 1000  # hybrid ts < 2**63: the int64 view is exact, and no copy
    return pa.Array.from_buffers(_EVENT_TIME, len(us), [None, pa.py_buffer(us)])


# The size of the Arrow batches handed to Spark (docs/benchmarks.md, "What a read costs, per stage"): a message's
# piece of at least this many bytes goes as its own batch (concatenating it would copy every column again for
# nothing); runs of smaller pieces are joined into batches of about this size (fewer batches: Spark's JVM pays per
# batch). Measured in CPU seconds of the JVM and Python workers (bench/profile_batch_sizes.py): ~1 MiB batches
# cost the JVM less than 0.5 MiB ones (a 1000-row insert of 128-d vectors) and the Python side no more than
# passing those through; 4-8 MiB ones cost the workers their copy.
PASS_THROUGH_BYTES = 1024 * 1024


class RowsBuilder:
    """Accumulates per-message pieces and emits RecordBatches of the exact Spark Arrow schema."""

    def __init__(self, arrow_schema: pa.Schema, group: str = "", pk_name: str | None = None) -> None:
        self.schema = arrow_schema
        self.group = group
        self.pk = pk_name
        self.pieces: list[pa.RecordBatch] = []
        self.rows = 0
        self._repeated: dict[tuple, pa.Array] = {}
        self._group: tuple = ()  # (channel, op, ts) of the last message and its rank among equal ones
        self._rank = 0
        self._structs = struct_targets(arrow_schema)  # list<struct> columns rebuilt from flattened sub-fields

    def _column(self, name: str, typ: pa.DataType, n: int, values: dict[str, Any]) -> pa.Array:
        v = values.get(name)
        if isinstance(v, pa.Array):
            return v if v.type == typ else v.cast(typ)
        if isinstance(v, np.ndarray):
            return pa.array(v).cast(typ)
        if name not in _RECURRING:  # one value on every row of this message only (msg id, position)
            return pa.nulls(n, typ) if v is None else pa.repeat(pa.scalar(v, type=typ), n)
        # op, channel, shard, collection, partition recur message after message: built once
        key = (name, v, n)
        col = self._repeated.get(key)
        if col is None:
            col = pa.nulls(n, typ) if v is None else pa.repeat(pa.scalar(v, type=typ), n)
            if len(self._repeated) >= 64:
                self._repeated.clear()
            self._repeated[key] = col
        return col

    def add(self, msg: TsMsg, channel: str, msg_id: bytes, position: MsgPosition | None = None,
            fields: dict[str, pa.Array] | None = None) -> None:
        """The rows of one insert/delete; ``position`` (a 2.6 row's ``_lc`` position) becomes ``_position``;
        ``fields``: an insert's ``field_arrays()`` when the caller decoded them already (taken over)."""
        if isinstance(msg, InsertMsg):
            n = msg.num_rows
            values: dict[str, Any] = fields if fields is not None else msg.field_arrays()
            if self._structs:
                rebuild_structs(values, self._structs)
            op = "insert"
        elif isinstance(msg, DeleteMsg):
            pks = msg.primary_keys
            n = len(pks)
            pk_name = self._pk_name()
            values = {pk_name: pa.array(pks)} if pk_name else {}
            op = "delete"
        else:
            return
        if n == 0:
            return
        ts = msg.timestamps
        begin = msg.begin_ts  # computed from the rows' timestamps: once per message
        values.update({
            SEQ: seq_array(ts, op, None, self._message_rank(channel, op, begin)),
            OP: op, "_channel": channel, "_shard": msg.shard_name, "_collection": msg.collection_id,
            "_partition": msg.partition_id, "_ts": pa.array(ts.view(np.int64)), "_event_time": _event_time(ts),
            "_msg_id": msg_id,
            "_position": (position.to_base64() if position is not None
                          else resume_position(channel, msg_id, begin, self.group)),
        })
        cols = [self._column(f.name, f.type, n, values) for f in self.schema]
        self.pieces.append(pa.RecordBatch.from_arrays(cols, schema=self.schema))
        self.rows += n

    def removal(self, msg: TsMsg, op: str, partition: int | None, shard: str, channel: str, msg_id: bytes) -> None:
        """One row for a message that removes rows by itself (option ``removalRows``): ``op`` ``drop_partition``
        (``_partition`` the dropped partition id) or ``truncate`` (``_partition`` the collection's shard count
        its broadcast header names, 0: not named), ``_shard`` the vchannel of its copy, the fields null."""
        ts = np.array([msg.timestamp], dtype=np.uint64)
        values: dict[str, Any] = {
            SEQ: seq_array(ts, "delete", None, 0), OP: op, "_channel": channel, "_shard": shard,
            "_collection": msg.collection_id, "_partition": partition, "_ts": pa.array(ts.view(np.int64)),
            "_event_time": _event_time(ts), "_msg_id": msg_id,
            "_position": resume_position(channel, msg_id, msg.timestamp, self.group)}
        cols = [self._column(f.name, f.type, 1, values) for f in self.schema]
        self.pieces.append(pa.RecordBatch.from_arrays(cols, schema=self.schema))

    def _message_rank(self, channel: str, op: str, ts: int) -> int:
        """0, or 1, 2, ... for the next consecutive messages of one channel with the same type and timestamp
        (one request split into several messages): an earlier message's rows win (``_seq``)."""
        group = (channel, op, ts)
        self._rank = self._rank + 1 if group == self._group else 0
        self._group = group
        return self._rank

    def _pk_name(self) -> str | None:
        if self.pk:
            return self.pk
        for f in self.schema:  # the first non-op, non-metadata field
            if f.name != OP and f.name not in METADATA:
                return f.name
        return None

    def flush(self) -> list[pa.RecordBatch]:
        """The pieces in order: large ones as they are (no copy), runs of small ones concatenated into batches of
        about ``PASS_THROUGH_BYTES``."""
        out: list[pa.RecordBatch] = []
        small: list[pa.RecordBatch] = []
        run = 0
        for piece in self.pieces:  # the buffers' sizes: O(columns), where ``nbytes`` walks the offsets (~30x the cost)
            size = piece.get_total_buffer_size()
            if size >= PASS_THROUGH_BYTES:
                if small:
                    out.append(_concat(small))
                    small, run = [], 0
                out.append(piece)
                continue
            small.append(piece)
            run += size
            if run >= PASS_THROUGH_BYTES:
                out.append(_concat(small))
                small, run = [], 0
        if small:
            out.append(_concat(small))
        self.pieces, self.rows = [], 0
        return out


def _concat(pieces: list[pa.RecordBatch]) -> pa.RecordBatch:
    return pa.concat_batches(pieces) if len(pieces) > 1 else pieces[0]


class MessagesBuilder:
    """One row per message; the payload is not decoded beyond its header."""

    def __init__(self, arrow_schema: pa.Schema, group: str = "") -> None:
        self.schema = arrow_schema
        self.group = group
        self.cols: dict[str, list] = {f.name: [] for f in arrow_schema}
        self.rows = 0

    def add_raw(self, m: Any, msg: TsMsg | None) -> None:
        c = self.cols
        mid = m.id.serialize()
        values = {"channel": m.channel, "msg_id": mid, "properties": sorted(dict(m.properties).items()),
                  "payload": bytes(m.payload)}
        values.update(_wal_columns(m, msg))
        if msg is not None and msg.wal is not None:
            t, begin = msg.wal.type_name, msg.wal.time_tick
            values.update(timestamp=begin, begin_ts=begin, end_ts=begin, shard=msg.wal.vchannel,
                          collection_id=msg.collection_id or None,
                          num_rows=int(getattr(msg.proto, "num_rows", 0) or 0))
        else:
            raw_t = msg.msg_type if msg is not None else (None if "version" in values else _safe_type(m))
            t = codec.msg_type_name(raw_t) if raw_t is not None else values.get("msg_type")
            begin = msg.begin_ts if msg is not None else 0
            values.update(
                timestamp=msg.timestamp if msg is not None else 0, begin_ts=begin,
                end_ts=msg.end_ts if msg is not None else 0,
                collection_id=msg.collection_id if msg is not None and hasattr(msg.proto, "collectionID") else None,
                shard=getattr(msg.proto, "shardName", None) if msg is not None else None,
                num_rows=int(getattr(msg.proto, "num_rows", 0)) if msg is not None else None)
        base_ts = values["timestamp"]
        values.update(msg_type=t, event_time=(base_ts >> 18) * 1000 if base_ts else None,
                      position=resume_position(m.channel, mid, begin, self.group))
        for name in c:
            c[name].append(values.get(name))
        self.rows += 1

    def flush(self) -> list[pa.RecordBatch]:
        if not self.rows:
            return []
        arrays = []
        for f in self.schema:
            vals = self.cols[f.name]
            if pa.types.is_timestamp(f.type):
                arrays.append(pa.array(vals, pa.int64()).cast(pa.timestamp("us", tz="UTC")).cast(f.type))
            else:
                arrays.append(pa.array(vals, f.type))
        self.cols = {f.name: [] for f in self.schema}
        self.rows = 0
        return [pa.RecordBatch.from_arrays(arrays, schema=self.schema)]


def _signed(v: int | None) -> int | None:
    """A uint64 id in a bigint column: values >= 2**63 wrap as Go's int64 conversion does."""
    return None if v is None else (v - (1 << 64) if v >= 1 << 63 else v)


def _wal_columns(m: Any, msg: TsMsg | None) -> dict[str, Any]:
    """``version``, ``vchannel``, ``txn_id``, ``broadcast_id`` of a 2.6 message (null for 2.5 ones)."""
    env = msg.wal if msg is not None else None
    if env is None and msg is None and is_wal_message(m.properties):
        try:  # an undecodable message (onDecodeError=skip) still shows its envelope
            env = parse_envelope(m.properties)
        except DecodeError as exc:  # messages output shows what it can (a codec bug propagates)
            log.debug("channel %s msgID(base64)=%s: no envelope shown: %s", m.channel, b64(m.id.serialize()), exc)
            env = None
    if env is None:
        return {}
    return {"msg_type": env.type_name, "version": env.version, "vchannel": env.vchannel, "txn_id": _signed(env.txn_id),
            "broadcast_id": _signed(env.broadcast_id)}


def _safe_type(m: Any) -> int | None:
    try:
        return codec.peek_msg_type(m.payload, m.properties)
    except DecodeError as exc:  # messages output shows what it can (a codec bug propagates)
        log.debug("channel %s msgID(base64)=%s: no message type shown: %s", m.channel, b64(m.id.serialize()), exc)
        return None


def wanted_type(msg_type: int, message_types: tuple[str, ...] | None) -> bool:
    if message_types is None:
        return True
    try:
        return MsgType(msg_type).name.lower() in message_types
    except ValueError:
        return False
