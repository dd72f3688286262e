"""Collection schemas: Milvus ``CollectionSchema`` <-> Arrow, and inference from inserts."""

from __future__ import annotations

from typing import Any

import pyarrow as pa

from msgstream_spark.errors import SchemaError
from msgstream_spark.msg import columns as C
from msgstream_spark.msg.pb import common_pb2, schema_pb2
from msgstream_spark.msg.structs import struct_arrow_type, structs_from_columns
from msgstream_spark.msg.vectors import vector_array_kind

PK_NAMES = ("pk", "id", "primary_key", "_id")


def user_fields(schema: Any) -> list[Any]:
    """Fields with ids >= 100 (RowID 0 and Timestamp 1 are system fields)."""
    return [f for f in schema.fields if int(f.fieldID) >= 100 or int(f.fieldID) == 0 and f.name not in
            ("RowID", "Timestamp")]


def collection_arrow_schema(schema: Any) -> pa.Schema:
    """Arrow schema of the user fields, then the struct arrays as ``list<struct>`` (every column
    nullable on the Arrow side)."""
    cols = [pa.field(f.name, C.arrow_type_for(f), nullable=True) for f in user_fields(schema)]
    cols += [pa.field(ss.name, struct_arrow_type(ss), nullable=True) for ss in schema.struct_array_fields]
    return pa.schema(cols)


def field_schema_for_data(fd: Any, *, is_primary_key: bool = False) -> Any:
    """The FieldSchema a FieldData implies (type, dim, element type, nullable)."""

    fs = schema_pb2.FieldSchema(fieldID=int(fd.field_id), name=fd.field_name, data_type=int(fd.type),
                                is_primary_key=is_primary_key, nullable=len(fd.valid_data) > 0,
                                is_dynamic=bool(fd.is_dynamic))
    if int(fd.type) == C.ARRAY_OF_VECTOR:  # a struct sub-field under its raw name (2.6.0-2.6.3)
        fs.element_type, dim = vector_array_kind(fd.vectors.vector_array)
        fs.type_params.append(common_pb2.KeyValuePair(key="dim", value=str(dim)))
    elif fd.WhichOneof("field") == "vectors" and int(fd.type) != C.SPARSE_VECTOR:
        fs.type_params.append(common_pb2.KeyValuePair(key="dim", value=str(int(fd.vectors.dim))))
    if int(fd.type) == C.ARRAY:
        fs.element_type = C.array_element_type(fd)  # Milvus 2.3.5 writes 0: then the rows' slot says
    return fs


def infer_collection_schema(insert: Any, name: str = "") -> Any:
    """A CollectionSchema from an InsertRequest's FieldData.

    FieldData does not say which field is the primary key. Rule: an Int64/VarChar field
    named pk, id, primary_key or _id; else the first Int64 or VarChar field by field id.
    """

    fds = sorted(insert.fields_data, key=lambda f: int(f.field_id))
    keyable = [f for f in fds if int(f.type) in (C.INT64, C.VARCHAR)]
    pk = next((f for f in keyable if f.field_name.lower() in PK_NAMES), keyable[0] if keyable else None)
    schema = schema_pb2.CollectionSchema(name=name or insert.collection_name)
    structs = structs_from_columns(fds)  # flattened ``struct[sub]`` columns (Milvus 2.6.4+ names)
    in_structs = {sub.name for ss in structs for sub in ss.fields}
    for fd in fds:
        if fd.field_name not in in_structs:
            schema.fields.append(field_schema_for_data(fd, is_primary_key=pk is not None and fd is pk))
    schema.struct_array_fields.extend(structs)
    return schema


_ARROW_TO_MILVUS = [
    (pa.types.is_boolean, C.BOOL), (pa.types.is_int8, C.INT8), (pa.types.is_int16, C.INT16),
    (pa.types.is_int32, C.INT32), (pa.types.is_int64, C.INT64), (pa.types.is_float32, C.FLOAT),
    (pa.types.is_float64, C.DOUBLE), (pa.types.is_string, C.VARCHAR), (pa.types.is_large_string, C.VARCHAR),
    (pa.types.is_binary, C.BINARY_VECTOR), (pa.types.is_large_binary, C.BINARY_VECTOR),
    (pa.types.is_fixed_size_binary, C.BINARY_VECTOR), (pa.types.is_map, C.SPARSE_VECTOR),
    (pa.types.is_timestamp, C.TIMESTAMPTZ),
]
_UNSIGNED_OK = (pa.types.is_uint8, pa.types.is_uint16)


def _parse_type_name(name: str) -> int:
    lookup = {n.lower(): v for n, v in schema_pb2.DataType.items()}
    t = lookup.get(name.strip().lower())
    if t is None:
        raise SchemaError(f"unknown Milvus type {name!r}; e.g. FloatVector, Float16Vector, BFloat16Vector, "
                          "Int8Vector, BinaryVector, SparseFloatVector, JSON, VarChar, Text, Geometry, "
                          "Timestamptz, Int64")
    return int(t)


def field_schema_from_arrow(name: str, pa_type: pa.DataType, *, field_id: int, is_primary_key: bool = False,
                            nullable: bool = False, dim: int | None = None, milvus_type: str | int | None = None,
                            max_length: int = 65535) -> Any:
    """A FieldSchema for an Arrow (Spark) column.

    list<float|double> -> FloatVector, list<other> -> Array, binary -> BinaryVector,
    map<int, float> -> SparseFloatVector, string -> VarChar. ``milvus_type`` overrides
    (e.g. "Float16Vector", "JSON", "Int8Vector"). ``dim`` may be omitted for vectors:
    it is then taken from the data (fixed_size_list gives it directly).
    """

    elem = 0
    if milvus_type is not None:
        t = milvus_type if isinstance(milvus_type, int) else _parse_type_name(milvus_type)
        if not C.is_known_type(t) or t == C.ARRAY_OF_VECTOR:
            raise SchemaError(f"column {name!r}: Milvus type {C.type_name(t)} ({t}) cannot be written "
                              "(no released Milvus writes it, or Milvus allows it only inside a struct array)")
    elif pa.types.is_list(pa_type) or pa.types.is_large_list(pa_type) or pa.types.is_fixed_size_list(pa_type):
        vt = pa_type.value_type
        if pa.types.is_floating(vt):
            t = C.FLOAT_VECTOR
        else:
            t = C.ARRAY
    else:
        t = next((m for pred, m in _ARROW_TO_MILVUS if pred(pa_type)), None)
        if t is None and any(p(pa_type) for p in _UNSIGNED_OK):
            t = C.INT32
        if t is None:
            raise SchemaError(f"column {name!r}: Arrow type {pa_type} has no Milvus equivalent")
    if t == C.ARRAY:
        if not (pa.types.is_list(pa_type) or pa.types.is_large_list(pa_type) or pa.types.is_fixed_size_list(pa_type)):
            raise SchemaError(f"column {name!r}: an Array field needs a list column, got {pa_type}")
        inner = field_schema_from_arrow(name, pa_type.value_type, field_id=field_id)
        elem = int(inner.data_type)
        if elem >= 100 or elem in (C.ARRAY, C.JSON):
            raise SchemaError(f"column {name!r}: Array of {pa_type.value_type} is not supported")
    if is_primary_key and t not in (C.INT64, C.VARCHAR):
        raise SchemaError(f"primary key column {name!r} must be Int64 or VarChar, got {pa_type}")
    if is_primary_key and nullable:
        raise SchemaError(f"primary key column {name!r} cannot be nullable")
    fs = schema_pb2.FieldSchema(fieldID=int(field_id), name=name, data_type=int(t), is_primary_key=is_primary_key,
                                nullable=bool(nullable) and t < 100, element_type=elem)
    if dim is None and pa.types.is_fixed_size_list(pa_type):
        dim = pa_type.list_size
    if dim is None and pa.types.is_fixed_size_binary(pa_type):
        dim = pa_type.byte_width * 8
    if t in (C.FLOAT_VECTOR, C.FLOAT16_VECTOR, C.BFLOAT16_VECTOR, C.INT8_VECTOR, C.BINARY_VECTOR) and dim:
        if t == C.BINARY_VECTOR and dim % 8:
            raise SchemaError(f"column {name!r}: BinaryVector dim must be a multiple of 8, got {dim}")
        fs.type_params.append(common_pb2.KeyValuePair(key="dim", value=str(int(dim))))
    if t in (C.VARCHAR, C.STRING) or elem == C.VARCHAR:
        fs.type_params.append(common_pb2.KeyValuePair(key="max_length", value=str(max_length)))
    return fs
