"""The query side of the suite's Milvus proxy: ``Query`` over a model of the collection's current rows.

A test that writes a collection's messages (2.6 WAL entries into the proxy's store, or 2.5 msgstream
messages on a broker) keeps a :class:`CollectionModel` next to them: pk -> row, changed under the
proxy's one lock (``ProxyState.lock``) together with writing the messages, with every message's time
from the proxy's TSO (:func:`tests.milvus_proxy.wal.tso_now`, allocated under that lock). ``Query``
answers from the model under the same lock.

What it copies from Milvus, as pymilvus 3.0.2's client code sends and reads it (Milvus's repository
was too large to mirror here: the texts and codes were checked against Milvus's own client tests and
proxy excerpts found by search, e.g. ``err_code 65535`` with "empty expression should be used with
limit" and "partition name %s not found"; not against ``task_query.go`` line by line):

* a collection the proxy does not know answers status 100 "collection not found" (as
  ``DescribeCollection``: pymilvus's ``has_collection`` reads that answer); ``DescribeCollection``
  sends the collection's schema;
* ``output_fields=["count(*)"]`` answers one Int64 ``FieldData`` named ``count(*)``; ``*`` is every
  field of the schema, the dynamic one (``$meta``, ``is_dynamic``) included; the primary key is always
  returned; a name the schema lacks fails ("field ... not exist");
* ``limit`` and ``offset`` come as ``query_params``; without a limit an expression is required
  (empty expression with no limit and no ``count(*)``: "empty expression should be used with limit");
  a ``limit`` query answers the smallest matching keys in key order (seen on the real 2.3.5 across sealed
  and growing segments of two shards, with and without an expression: segcore's ``find_first`` walks the
  key-ordered offsets, results merged by smallest key);
* columns are ``FieldData`` of Milvus's types (Bool, Int8/16/32/64, Float, Double, VarChar, JSON,
  FloatVector, BinaryVector; nullable fields with ``valid_data``), ``QueryResults.output_fields``
  naming them;
* ``partition_names`` limits a query to those partitions (an unknown name: "partition name ... not
  found"); ``ShowPartitions`` lists the model's partitions (name, id);
* the time a query reads at is the oldest its consistency level lets Milvus read at (Milvus reads at the
  query node's safe time once it has reached the request's guarantee timestamp, which the proxy sets per
  level: ``parseGuaranteeTsFromConsistency``): Strong (and the collection's default, which the suite's
  collections keep Strong) now, a write done before the query is seen; Session and Customized at the
  request's ``guarantee_timestamp``; Bounded, Eventually, and Session or Customized without a timestamp,
  ``GRACEFUL_MS`` before now (``common.gracefulTime``; checked on the real 2.3.5: a Bounded query right
  after an insert returned does not see it, a Customized one with the insert's timestamp does).

Simplified: the model has no other lag; expressions are what the mirror's snapshot sends: comparisons
``field op literal`` (``<``, ``<=``, ``>``, ``>=``, ``==``, ``!=``; integer or double-quoted string
literals) joined by ``and`` / ``or`` (``and`` binding tighter), anything else fails with Milvus's "cannot
parse expression" text; answers without a limit come sorted by primary key too (Milvus's order is then by
segment; the snapshot does not depend on it); a row's partition is set by the test (no partition-key
routing); no output of single dynamic keys.
"""

from __future__ import annotations

import datetime
import json
import re
import threading
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from msgstream_spark.msg.pb import schema_pb2
from tests.milvus_proxy.wal import tso_now

DT = schema_pb2.DataType
META = "$meta"
COUNT = "count(*)"
_TOKEN = re.compile(r'\s*("(?:[^"\\]|\\.)*"|-?\d+|>=|<=|==|!=|<|>|[A-Za-z_$][\w$]*|\S)')
_OPS: dict[str, Callable[[Any, Any], bool]] = {
    "<": lambda a, b: a < b, "<=": lambda a, b: a <= b, ">": lambda a, b: a > b, ">=": lambda a, b: a >= b,
    "==": lambda a, b: a == b, "!=": lambda a, b: a != b}
_SCALARS = {DT.Bool: "bool_data", DT.Int8: "int_data", DT.Int16: "int_data", DT.Int32: "int_data",
            DT.Int64: "long_data", DT.Float: "float_data", DT.Double: "double_data", DT.VarChar: "string_data"}
_ZERO = {"bool_data": False, "int_data": 0, "long_data": 0, "float_data": 0.0, "double_data": 0.0,
         "string_data": ""}


GRACEFUL_MS = 5000
STRONG, SESSION, BOUNDED, EVENTUALLY, CUSTOMIZED = 0, 1, 2, 3, 4  # common.ConsistencyLevel


class QueryError(Exception):
    """A query Milvus refuses: its status code and text."""

    def __init__(self, code: int, reason: str) -> None:
        super().__init__(reason)
        self.code = code


@dataclass
class CollectionModel:
    """A collection's current rows (pk -> row: field name -> value, ``$meta`` a dict, ``_partition`` the
    partition's id); change them only while holding ``lock`` (the proxy's), together with writing the
    matching messages."""

    schema: schema_pb2.CollectionSchema
    lock: threading.RLock
    partitions: list = field(default_factory=lambda: [("_default", 1)])  # (name, id), as ShowPartitions lists
    rows: dict = field(default_factory=dict)
    version: int = 0  # +1 per change: what a query saw, for assertions
    collection_id: int = 0  # what a query's ``collection_id`` parameter must match (0: not checked)
    history: dict = field(default_factory=dict)  # pk -> [(ts, row or None)], in the order of the changes
    shards: int = 2  # a row's shard: crc32 of its key (Milvus hashes the key), for the iterator's reduce

    @property
    def pk(self) -> str:
        return next(f.name for f in self.schema.fields if f.is_primary_key)

    def put(self, rows: Iterable[dict], partition: str = "_default", ts: int | None = None) -> None:
        """Insert or upsert into ``partition`` at Milvus time ``ts`` (default: the proxy's TSO now): each row
        replaces the one with its key."""
        pid = dict(self.partitions)[partition]
        ts = tso_now() if ts is None else ts
        for r in rows:
            self.rows[r[self.pk]] = {**r, "_partition": pid}
            self.history.setdefault(r[self.pk], []).append((ts, self.rows[r[self.pk]]))
        self.version += 1

    def remove(self, pks: Iterable[Any], ts: int | None = None) -> None:
        ts = tso_now() if ts is None else ts
        for pk in pks:
            self.rows.pop(pk, None)
            self.history.setdefault(pk, []).append((ts, None))
        self.version += 1

    def rows_at(self, ts: int) -> dict:
        """The rows as of Milvus time ``ts`` (MVCC: each key's last change at or before ``ts``)."""
        out = {}
        for pk, changes in self.history.items():
            seen = [r for t, r in changes if t <= ts]
            if seen and seen[-1] is not None:
                out[pk] = seen[-1]
        return out

    def snapshot(self) -> dict:
        with self.lock:
            return {k: dict(v) for k, v in self.rows.items()}


# -- FieldData, as Milvus's proxy fills it ------------------------------------------------------------
def field_data(f: schema_pb2.FieldSchema, values: list) -> schema_pb2.FieldData:
    """One column of ``values`` (None: null) as Milvus's ``FieldData`` of field ``f``."""
    fd = schema_pb2.FieldData(type=f.data_type, field_name=f.name, field_id=f.fieldID, is_dynamic=f.is_dynamic)
    if f.nullable:
        fd.valid_data.extend(v is not None for v in values)
    attr = _SCALARS.get(f.data_type)
    if attr is not None:
        getattr(fd.scalars, attr).data.extend(_ZERO[attr] if v is None else v for v in values)
    elif f.data_type == DT.JSON:  # bytes: as stored (Milvus answers the stored bytes, never re-serialized)
        fd.scalars.json_data.data.extend(b"" if v is None else v if isinstance(v, bytes)
                                         else json.dumps(v, separators=(",", ":")).encode() for v in values)
    elif f.data_type in (DT.VarChar, DT.Text):
        fd.scalars.string_data.data.extend("" if v is None else v for v in values)
    elif f.data_type == DT.FloatVector:
        fd.vectors.dim = _dim(f)
        fd.vectors.float_vector.data.extend(x for v in values for x in v)
    elif f.data_type in _BYTE_VECTORS:  # rows of the stored bytes
        fd.vectors.dim = _dim(f)
        setattr(fd.vectors, _BYTE_VECTORS[f.data_type], b"".join(values))
    elif f.data_type == DT.Timestamptz:  # stored int64 us (UTC) -> ISO text (proxy ``timestamptzUTC2IsoStr``)
        fd.scalars.string_data.data.extend("" if v is None else iso_utc(v) for v in values)
    elif f.data_type == DT.Geometry:  # stored WKB -> WKT (proxy ``validateGeometryFieldSearchResult``)
        import shapely

        fd.scalars.geometry_wkt_data.data.extend("" if v is None else shapely.from_wkb(v).wkt for v in values)
    elif f.data_type == DT.Array:
        fd.scalars.array_data.element_type = f.element_type
        slot = _SCALARS[f.element_type]
        for v in values:
            getattr(fd.scalars.array_data.data.add(), slot).data.extend(v or [])
    else:
        raise QueryError(1100, f"the suite's proxy has no FieldData for field {f.name} of type {f.data_type}")
    return fd


_BYTE_VECTORS = {DT.BinaryVector: "binary_vector", DT.Float16Vector: "float16_vector",
                 DT.BFloat16Vector: "bfloat16_vector", DT.Int8Vector: "int8_vector"}


def iso_utc(us: int) -> str:
    """Microseconds since the epoch as Go's RFC 3339 text in UTC with at most 6 fraction digits, trailing
    zeros dropped (Milvus's ``timestamptz.FormatTimeMicroWithoutTrailingZeros``)."""
    t = datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc) + datetime.timedelta(microseconds=us)
    frac = f"{t.microsecond:06d}".rstrip("0")
    return t.strftime("%Y-%m-%dT%H:%M:%S") + (f".{frac}" if frac else "") + "Z"


def _dim(f: schema_pb2.FieldSchema) -> int:
    return int(next(p.value for p in f.type_params if p.key == "dim"))


def columns(schema: schema_pb2.CollectionSchema, rows: list[dict]) -> list[schema_pb2.FieldData]:
    """Every field of ``schema`` for ``rows`` (an insert's ``fields_data``; the dynamic field as ``{}``
    for a row without dynamic keys)."""
    return [field_data(f, [r.get(f.name, {} if f.is_dynamic else None) for r in rows]) for f in schema.fields]


# -- expressions ------------------------------------------------------------------------------------
def parse_expr(expr: str) -> Callable[[dict], bool]:
    """A row predicate for ``expr`` (comparisons joined by and/or); empty: every row."""
    if not expr.strip():
        return lambda _row: True
    toks, pos = [], 0
    while expr[pos:].strip():  # tokens one after the other (whitespace between them; any inside a literal)
        m = _TOKEN.match(expr, pos)
        if m is None:
            raise _unparsable(expr)
        toks.append(m.group(1))
        pos = m.end()
    clauses: list[list[tuple[str, str, Any]]] = [[]]
    i = 0
    while i < len(toks):
        if len(toks) < i + 3 or not re.fullmatch(r"[A-Za-z_$][\w$]*", toks[i]) or toks[i + 1] not in _OPS:
            raise _unparsable(expr)
        clauses[-1].append((toks[i], toks[i + 1], _literal(toks[i + 2], expr)))
        i += 3
        if i < len(toks):
            if toks[i] not in ("and", "or") or i + 1 == len(toks):
                raise _unparsable(expr)
            if toks[i] == "or":
                clauses.append([])
            i += 1

    def match(row: dict) -> bool:
        return any(all(row.get(n) is not None and _OPS[op](row[n], v) for n, op, v in c) for c in clauses)

    return match


_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\",
            '"': '"', "'": "'"}


def go_unquote(tok: str, expr: str) -> str:
    """A double-quoted literal as Go's ``strconv.Unquote`` reads it (Milvus's parser): ``\\x``, octal,
    ``\\u`` and ``\\U`` escapes must name valid scalar values (a surrogate escape is a syntax error)."""
    body, out, i = tok[1:-1], [], 0
    while i < len(body):
        ch = body[i]
        if ch != "\\":
            out.append(ch)
            i += 1
            continue
        kind = body[i + 1: i + 2]
        if kind in _ESCAPES:
            out.append(_ESCAPES[kind])
            i += 2
            continue
        width = {"x": 2, "u": 4, "U": 8}.get(kind)
        digits = body[i + 2: i + 2 + width] if width else body[i + 1: i + 4]
        base = 16 if width else 8
        allowed = "0123456789abcdefABCDEF" if base == 16 else "01234567"
        if len(digits) != (width or 3) or any(c not in allowed for c in digits):
            raise _unparsable(expr)
        cp = int(digits, base)
        if 0xD800 <= cp <= 0xDFFF or cp > 0x10FFFF:
            raise _unparsable(expr)
        out.append(chr(cp))
        i += 2 + width if width else 4
    return "".join(out)


def _literal(tok: str, expr: str) -> Any:
    if tok.startswith('"'):
        return go_unquote(tok, expr)
    if re.fullmatch(r"-?\d+", tok):
        return int(tok)
    raise _unparsable(expr)


def _unparsable(expr: str) -> QueryError:
    return QueryError(1100, f"failed to create query plan: cannot parse expression: {expr}: invalid parameter")


# -- Query ------------------------------------------------------------------------------------------
def _params(request) -> dict[str, str]:
    return {kv.key: kv.value for kv in request.query_params}


def _outputs(schema: schema_pb2.CollectionSchema, asked: list[str]) -> list[schema_pb2.FieldSchema]:
    by_name = {f.name: f for f in schema.fields}
    pk = next(f for f in schema.fields if f.is_primary_key)
    names = [f.name for f in schema.fields] if "*" in asked else [pk.name, *[n for n in asked if n != pk.name]]
    missing = [n for n in names if n not in by_name]
    if missing:
        raise QueryError(1100, f"field {missing[0]} not exist: invalid parameter")
    return [by_name[n] for n in names]


@dataclass
class Answer:
    columns: list
    names: list
    version: int  # the model version seen
    session_ts: int = 0  # an iterator's first page without a timestamp: the MVCC time it read at


def _shard(pk: Any, shards: int) -> int:
    return zlib.crc32(str(pk).encode()) % shards


def _in_order(hits: list[dict], pk: str, shards: int, limit: int | None) -> list[dict]:
    """An iterator query's reduce (Milvus ``reduceRetrieveResults`` with ``IReduceInOrder``): each shard's
    rows in key order (at most ``limit``), merged by smallest key, stopping as soon as one non-empty
    shard's rows are used up (``SelectMinPK`` reporting a drained result)."""
    lists = [sorted((r for r in hits if _shard(r[pk], shards) == i), key=lambda r: r[pk]) for i in range(shards)]
    lists = [(rows[:limit] if limit is not None else rows) for rows in lists if rows]
    cursors = [0] * len(lists)
    out: list[dict] = []
    while lists and (limit is None or len(out) < limit):
        if any(c >= len(rows) for c, rows in zip(cursors, lists)):
            break
        i = min(range(len(lists)), key=lambda j: lists[j][cursors[j]][pk])
        out.append(lists[i][cursors[i]])
        cursors[i] += 1
    return out


def read_ts(request, iterator: bool) -> int | None:
    """The Milvus time a query reads at (None: now, Strong), the oldest its level allows."""
    g = int(request.guarantee_timestamp)
    if iterator and g:
        return g  # pinned: the proxy sets the MVCC time to the guarantee
    level = STRONG if request.use_default_consistency else int(request.consistency_level)
    if level == STRONG:
        return None
    if level in (SESSION, CUSTOMIZED) and g:
        return g
    return tso_now() - (GRACEFUL_MS << 18)


def answer(model: CollectionModel, request, max_output_bytes: int = 0) -> Answer:
    """The columns, output field names and model version seen for a ``QueryRequest``, as Milvus answers:
    ``collection_id`` checked (``PreExecute``); with ``iterator`` and a ``guarantee_timestamp`` the rows
    as of that time (MVCC), with ``iterator`` alone the rows now and their time as ``session_ts``;
    ``max_output_bytes`` > 0 refuses larger answers as ``maxOutputSize`` does."""
    params = _params(request)
    asked = list(request.output_fields)
    cid = int(params.get("collection_id", 0) or 0)
    if cid and model.collection_id and cid != model.collection_id:
        raise QueryError(1100, "Input collection id is not consistent to collectionID in the context,alias or "
                               "database may have changed: invalid parameter")
    iterator = params.get("iterator", "").lower() == "true"
    limit = int(params["limit"]) if "limit" in params else None
    offset = int(params.get("offset", 0))
    if not request.expr.strip() and limit is None and asked != [COUNT]:
        raise QueryError(65535, "empty expression should be used with limit")
    match = parse_expr(request.expr)
    named = dict(model.partitions)
    unknown = [n for n in request.partition_names if n not in named]
    if unknown:
        raise QueryError(65535, f"partition name {unknown[0]} not found")
    parts = {named[n] for n in request.partition_names} or set(named.values())
    session_ts = 0
    with model.lock:  # every write done before this query, up to the time its level reads at
        version = model.version
        at = read_ts(request, iterator)
        rows = model.rows if at is None else model.rows_at(at)
        if iterator and not request.guarantee_timestamp:
            session_ts = tso_now() if at is None else at
        hits = [dict(r) for _, r in sorted(rows.items()) if r["_partition"] in parts and match(r)]
    if asked == [COUNT]:
        fd = schema_pb2.FieldData(type=DT.Int64, field_name=COUNT)
        fd.scalars.long_data.data.append(len(hits))
        return Answer([fd], [COUNT], version)
    if iterator:
        hits = _in_order(hits, model.pk, model.shards, None if limit is None else limit + offset)[offset:]
    else:
        hits = hits[offset:] if limit is None else hits[offset:offset + limit]
    outs = _outputs(model.schema, asked)
    cols = [field_data(f, [r.get(f.name, {} if f.is_dynamic else None) for r in hits]) for f in outs]
    size = sum(c.ByteSize() for c in cols)
    if max_output_bytes and size > max_output_bytes:
        raise QueryError(65535, f"query results exceed the maxOutputSize Limit {max_output_bytes}")
    return Answer(cols, [f.name for f in outs], version, session_ts)
