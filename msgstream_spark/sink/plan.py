"""The write plan: the input Arrow schema mapped to a Milvus collection's fields.

Computed once per write on the driver (and by the CLI), before anything is produced, so a
column Milvus cannot hold fails the job up front with its name.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field

import pyarrow as pa

from msgstream_spark.errors import MsgStreamError, SchemaError
from msgstream_spark.msg.pb import schema_pb2
from msgstream_spark.msg.schema import field_schema_from_arrow
from msgstream_spark.msg.structs import struct_schema_from_arrow
from msgstream_spark.sink.options import METADATA_COLUMNS, OP_COLUMN, SinkOptions

PK_CANDIDATES = ("pk", "id")
STRUCT_TYPE = "ArrayOfStruct"  # a list<struct> column: written flattened, one column per sub-field


@dataclass(frozen=True)
class FieldPlan:
    """One collection field: its column, Milvus schema (serialized FieldSchema) and type name."""

    name: str
    field_id: int
    schema_bytes: bytes
    type_name: str
    dim: int | None = None


@dataclass(frozen=True)
class WritePlan:
    """What a write task needs to encode rows: the fields (pk first) and the op column."""

    pk: str
    pk_is_string: bool
    fields: tuple[FieldPlan, ...]
    has_op: bool
    # column -> dimension fixed by the plan (None: taken from the first row of each task)
    dims: dict[str, int] = field(default_factory=dict)

    def field_schemas(self):
        """Each field's ``FieldSchema`` (a struct array's ``StructArrayFieldSchema``)."""
        out = []
        for f in self.fields:
            fs = schema_pb2.StructArrayFieldSchema() if f.type_name == STRUCT_TYPE else schema_pb2.FieldSchema()
            fs.ParseFromString(f.schema_bytes)
            out.append(fs)
        return out


def _type_name(fs) -> str:
    return schema_pb2.DataType.Name(fs.data_type)


def plan_write(schema: pa.Schema, opts: SinkOptions) -> WritePlan:
    """Map the input Arrow schema to collection fields; reject what Milvus cannot hold.

    Raises :class:`SchemaError` naming the column (unsupported type, bad primary key,
    bad ``op`` column) before anything is produced.
    """

    names = [n for n in schema.names if n not in METADATA_COLUMNS]
    has_op = OP_COLUMN in names
    if has_op:
        t = schema.field(OP_COLUMN).type
        if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
            raise SchemaError(f"column {OP_COLUMN!r} must be a string ('insert' or 'delete'), got {t}")
        names.remove(OP_COLUMN)
    pk, pk_is_string = _primary_key(schema, names, opts)
    unknown_types = set(opts.field_types) - set(names)
    if unknown_types:
        raise SchemaError(f"option fieldTypes names column(s) the DataFrame does not have: "
                          f"{', '.join(sorted(unknown_types))}")
    ordered = [pk] + [n for n in names if n != pk]
    sub_ids = itertools.count(100 + len(ordered))  # struct sub-fields are numbered after every column
    plans = [_field_plan(schema, name, 100 + i, pk, pk_is_string, opts, sub_ids) for i, name in enumerate(ordered)]
    dims = {p.name: p.dim for p in plans if p.dim}
    return WritePlan(pk, pk_is_string, tuple(plans), has_op, dims)


def _primary_key(schema: pa.Schema, names: list[str], opts: SinkOptions) -> tuple[str, bool]:
    """The primary key column (option primaryKey, else pk/id) and whether it is a string."""
    pk = opts.primary_key
    if pk is None:
        pk = next((c for c in PK_CANDIDATES if c in names), None)
        if pk is None:
            raise SchemaError(f"no primary key column: set option primaryKey (columns: {', '.join(names)})")
    if pk not in names:
        raise SchemaError(f"option primaryKey names column {pk!r}, which the DataFrame does not have "
                          f"(columns: {', '.join(names)})")
    pk_type = schema.field(pk).type
    if pa.types.is_integer(pk_type):
        pk_is_string = False
    elif pa.types.is_string(pk_type) or pa.types.is_large_string(pk_type):
        pk_is_string = True
    else:
        raise SchemaError(f"primary key column {pk!r} must be an integer (Int64) or a string (VarChar), got {pk_type}")
    return pk, pk_is_string


def _field_plan(schema: pa.Schema, name: str, field_id: int, pk: str, pk_is_string: bool,
                opts: SinkOptions, sub_ids: Iterator[int]) -> FieldPlan:
    """The collection field for one column (SchemaError naming it when Milvus cannot hold it)."""
    typ = schema.field(name).type
    if pa.types.is_list(typ) and pa.types.is_struct(typ.value_type) and name != pk:
        ss = struct_schema_from_arrow(name, typ, field_id=field_id, sub_ids=[next(sub_ids) for _ in typ.value_type],
                                      nullable=schema.field(name).nullable)
        return FieldPlan(name, field_id, ss.SerializeToString(), STRUCT_TYPE)
    if name == pk and not pk_is_string:
        typ = pa.int64()
    if pa.types.is_map(typ) and not (pa.types.is_integer(typ.key_type) and pa.types.is_floating(typ.item_type)):
        raise SchemaError(f"column {name!r} ({typ}) cannot be stored in a collection: only map<integer, float> "
                          "(a SparseFloatVector) is supported")
    try:
        fs = field_schema_from_arrow(name, typ, field_id=field_id, is_primary_key=(name == pk),
                                     nullable=(name != pk and schema.field(name).nullable),
                                     milvus_type=opts.field_types.get(name), dim=opts_dim(opts, name))
    except (MsgStreamError, TypeError, ValueError, KeyError) as exc:
        raise SchemaError(f"column {name!r} ({typ}) cannot be stored in a collection: {exc}") from exc
    dim = None
    for p in fs.type_params:
        if p.key == "dim" and p.value:
            dim = int(p.value)
    return FieldPlan(name, field_id, fs.SerializeToString(), schema_pb2.DataType.Name(fs.data_type), dim)


def opts_dim(opts: SinkOptions, name: str) -> int | None:
    """A dimension fixed by ``fieldTypes`` (``emb:FloatVector(128)``), else None."""
    return opts.field_dims.get(name)
