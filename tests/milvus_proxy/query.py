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
* columns are ``FieldData`` of Milvus's types (Bool, Int8/16/32/64, Float, Double, VarChar, JSON,
  FloatVector, BinaryVector; nullable fields with ``valid_data``), ``QueryResults.output_fields``
  naming them;
* ``partition_names`` limits a query to those partitions (an unknown name: "partition name ... not
  found"); ``ShowPartitions`` lists the model's partitions (name, id);
* Strong consistency: a query sees every write done before it.

Simplified: every consistency level is Strong (the model has no lag); expressions are what the
mirror's snapshot sends: comparisons ``field op literal`` (``<``, ``<=``, ``>``, ``>=``, ``==``,
``!=``; integer or double-quoted string literals) joined by ``and`` / ``or`` (``and`` binding
tighter), anything else fails with Milvus's "cannot parse expression" text; results come sorted by
primary key (Milvus's order is by segment); a row's partition is set by the test (no partition-key
routing); no output of single dynamic keys.
"""

from __future__ import annotations

import json
import re
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from msgstream_spark.msg.pb import schema_pb2

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

    @property
    def pk(self) -> str:
        return next(f.name for f in self.schema.fields if f.is_primary_key)

    def put(self, rows: Iterable[dict], partition: str = "_default") -> None:
        """Insert or upsert into ``partition``: each row replaces the one with its key."""
        pid = dict(self.partitions)[partition]
        for r in rows:
            self.rows[r[self.pk]] = {**r, "_partition": pid}
        self.version += 1

    def remove(self, pks: Iterable[Any]) -> None:
        for pk in pks:
            self.rows.pop(pk, None)
        self.version += 1

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
    elif f.data_type == DT.JSON:
        fd.scalars.json_data.data.extend(
            b"" if v is None else json.dumps(v, separators=(",", ":")).encode() for v in values)
    elif f.data_type == DT.FloatVector:
        fd.vectors.dim = _dim(f)
        fd.vectors.float_vector.data.extend(x for v in values for x in v)
    elif f.data_type == DT.BinaryVector:
        fd.vectors.dim = _dim(f)
        fd.vectors.binary_vector = b"".join(values)
    else:
        raise QueryError(1100, f"the suite's proxy has no FieldData for field {f.name} of type {f.data_type}")
    return fd


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
    toks = _TOKEN.findall(expr)
    if "".join(toks) != re.sub(r"\s+", "", expr):
        raise _unparsable(expr)
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


def _literal(tok: str, expr: str) -> Any:
    if tok.startswith('"'):
        return json.loads(tok)
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


def answer(model: CollectionModel, request) -> tuple[list[schema_pb2.FieldData], list[str], int]:
    """(columns, output field names, the model version seen) for a ``QueryRequest``, as Milvus answers."""
    params = _params(request)
    asked = list(request.output_fields)
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
    with model.lock:  # Strong: every write done before this query
        version = model.version
        hits = [dict(r) for _, r in sorted(model.rows.items()) if r["_partition"] in parts and match(r)]
    if asked == [COUNT]:
        fd = schema_pb2.FieldData(type=DT.Int64, field_name=COUNT)
        fd.scalars.long_data.data.append(len(hits))
        return [fd], [COUNT], version
    hits = hits[offset:] if limit is None else hits[offset:offset + limit]
    outs = _outputs(model.schema, asked)
    return [field_data(f, [r.get(f.name, {} if f.is_dynamic else None) for r in hits]) for f in outs], \
        [f.name for f in outs], version
