"""Struct arrays (ArrayOfStruct, 200) between FieldData and Arrow.

A struct array never reaches the WAL as one column: Milvus's proxy
(internal/proxy/util.go ``checkAndFlattenStructFieldData``) replaces it by one top-level FieldData
per sub-field, typed Array or ArrayOfVector, with the sub-field's id, named ``struct[sub]``
(2.6.4+; the raw sub-field name before). Readers rebuild ``list<struct<...>>`` from those columns
with :func:`rebuild_structs`; the sink writes the flattened form with :func:`flatten_struct_column`.
Vector sub-fields are vector arrays (ArrayOfVector): see msg/vectors.py.
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from msgstream_spark.errors import SchemaError
from msgstream_spark.msg import columns as C
from msgstream_spark.msg import dtypes as T
from msgstream_spark.msg.pb import common_pb2, schema_pb2
from msgstream_spark.msg.vectors import vector_array_kind

# Arrow type -> Array element type of a struct's scalar field
_ELEMENTS = [(pa.types.is_boolean, T.BOOL), (pa.types.is_int8, T.INT8), (pa.types.is_int16, T.INT16),
             (pa.types.is_int32, T.INT32), (pa.types.is_int64, T.INT64), (pa.types.is_float32, T.FLOAT),
             (pa.types.is_float64, T.DOUBLE), (pa.types.is_string, T.VARCHAR), (pa.types.is_large_string, T.VARCHAR)]
_STORED = re.compile(r"^(?P<struct>[^\[\]]+)\[(?P<sub>[^\[\]]+)\]$")


# -- struct arrays: schema -------------------------------------------------------------------
def raw_sub_name(struct_name: str, stored: str) -> str:
    """``clips[emb]`` -> ``emb`` (a sub-field name as 2.6.4+ stores it); a raw name stays as it is."""
    m = _STORED.match(stored)
    return m.group("sub") if m and m.group("struct") == struct_name else stored


def stored_sub_name(struct_name: str, sub: str) -> str:
    """The name Milvus 2.6.4+ gives a sub-field and its flattened column (``ConcatStructFieldName``)."""
    return f"{struct_name}[{sub}]"


def struct_arrow_type(struct_schema: Any) -> pa.DataType:
    """``list<struct<sub: element type, ...>>`` of a ``StructArrayFieldSchema``."""
    children = []
    for sub in struct_schema.fields:
        if int(sub.data_type) not in (T.ARRAY, T.ARRAY_OF_VECTOR):
            raise SchemaError(f"struct {struct_schema.name!r}: sub-field {sub.name!r} has type "
                              f"{T.type_name(sub.data_type)}, not Array or ArrayOfVector")
        children.append(pa.field(raw_sub_name(struct_schema.name, sub.name), T.arrow_type_for(sub).value_type))
    return pa.list_(pa.struct(children))


def structs_from_columns(fds: list[Any]) -> list[Any]:
    """``StructArrayFieldSchema``s implied by flattened ``struct[sub]`` FieldData (Array / ArrayOfVector)."""
    out: dict[str, Any] = {}
    for fd in fds:
        m = _STORED.match(fd.field_name)
        if m is None or int(fd.type) not in (T.ARRAY, T.ARRAY_OF_VECTOR):
            continue
        ss = out.get(m.group("struct"))
        if ss is None:
            ss = out[m.group("struct")] = schema_pb2.StructArrayFieldSchema(name=m.group("struct"))
        sub = ss.fields.add(fieldID=int(fd.field_id), name=fd.field_name, data_type=int(fd.type),
                            nullable=len(fd.valid_data) > 0)
        if int(fd.type) == T.ARRAY:
            sub.element_type = C.array_element_type(fd)
        else:
            sub.element_type, dim = vector_array_kind(fd.vectors.vector_array)
            sub.type_params.append(common_pb2.KeyValuePair(key="dim", value=str(dim)))
    return list(out.values())


def struct_schema_from_arrow(name: str, typ: pa.DataType, *, field_id: int, sub_ids: list[int],
                             nullable: bool = False) -> Any:
    """A ``StructArrayFieldSchema`` for a ``list<struct<...>>`` column (sub-fields named ``name[sub]``).

    A child that is a list of floats becomes an ArrayOfVector of FloatVector, a list of int8 one of
    Int8Vector, binary one of BinaryVector; a scalar child an Array of that scalar type.
    """
    st = typ.value_type
    ss = schema_pb2.StructArrayFieldSchema(fieldID=int(field_id), name=name)
    for child, fid in zip(st, sub_ids):
        ct = child.type
        stored = stored_sub_name(name, child.name)
        if pa.types.is_list(ct) or pa.types.is_large_list(ct) or pa.types.is_fixed_size_list(ct):
            vt = ct.value_type
            elem = T.INT8_VECTOR if pa.types.is_int8(vt) else T.FLOAT_VECTOR if pa.types.is_floating(vt) else 0
            if not elem:
                raise SchemaError(f"column {name!r}: struct field {child.name!r} ({ct}) is neither a vector "
                                  "(list of floats or int8) nor a scalar")
            sub = schema_pb2.FieldSchema(fieldID=fid, name=stored, data_type=T.ARRAY_OF_VECTOR, element_type=elem,
                                         nullable=nullable)
            if pa.types.is_fixed_size_list(ct):
                sub.type_params.append(common_pb2.KeyValuePair(key="dim", value=str(ct.list_size)))
        elif pa.types.is_binary(ct) or pa.types.is_fixed_size_binary(ct):
            sub = schema_pb2.FieldSchema(fieldID=fid, name=stored, data_type=T.ARRAY_OF_VECTOR,
                                         element_type=T.BINARY_VECTOR, nullable=nullable)
        else:
            elem = next((t for pred, t in _ELEMENTS if pred(ct)), 0)
            if not elem:
                raise SchemaError(f"column {name!r}: struct field {child.name!r} ({ct}) cannot be an Array element")
            sub = schema_pb2.FieldSchema(fieldID=fid, name=stored, data_type=T.ARRAY, element_type=elem,
                                         nullable=nullable)
            if elem == T.VARCHAR:
                sub.type_params.append(common_pb2.KeyValuePair(key="max_length", value="65535"))
        ss.fields.append(sub)
    return ss


# -- struct arrays: data ---------------------------------------------------------------------
def struct_targets(schema: pa.Schema) -> list[tuple[str, pa.DataType]]:
    """The ``list<struct>`` columns of an Arrow schema (what :func:`rebuild_structs` fills)."""
    return [(f.name, f.type) for f in schema
            if pa.types.is_list(f.type) and pa.types.is_struct(f.type.value_type)]


def rebuild_structs(values: dict[str, pa.Array], targets: list[tuple[str, pa.DataType]]) -> None:
    """Put each wanted struct column into ``values`` from its flattened sub-field columns
    (``struct[sub]``, else the raw ``sub`` name of 2.6.0-2.6.3); absent when none is there."""
    for name, typ in targets:
        if name in values:
            continue
        subs = [values.get(stored_sub_name(name, c.name), values.get(c.name)) for c in typ.value_type]
        if any(s is not None for s in subs):
            values[name] = assemble_struct_array(name, subs, typ)


def assemble_struct_array(name: str, subs: list[pa.Array | None], typ: pa.DataType) -> pa.Array:
    """``list<struct>`` from one list column per sub-field (None: a sub-field absent, all null)."""
    st = typ.value_type
    present = [(i, s) for i, s in enumerate(subs) if s is not None]
    ref_i, ref = present[0]
    lengths = pc.list_value_length(ref).fill_null(0).to_numpy(zero_copy_only=False)
    for i, s in present[1:]:
        other = pc.list_value_length(s).fill_null(0).to_numpy(zero_copy_only=False)
        bad = np.nonzero(other != lengths)[0]
        if bad.size:
            r = int(bad[0])
            raise SchemaError(f"struct array {name!r}: row {r} has {int(lengths[r])} element(s) in "
                              f"{st.field(ref_i).name!r} but {int(other[r])} in {st.field(i).name!r}")
    total = int(lengths.sum())
    children = [pa.nulls(total, st.field(i).type) if s is None else s.flatten().cast(st.field(i).type)
                for i, s in enumerate(subs)]
    values = pa.StructArray.from_arrays(children, fields=list(st))
    offsets = np.zeros(len(lengths) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    mask = pa.array(ref.is_null().to_numpy(zero_copy_only=False)) if ref.null_count else None
    return pa.ListArray.from_arrays(pa.array(offsets), values, mask=mask)


def flatten_struct_column(arr: pa.Array, struct_schema: Any) -> list[Any]:
    """A ``list<struct>`` column as the proxy's flattened FieldData: one Array / ArrayOfVector per
    sub-field, named and numbered as the sub-field (null struct rows: sub-field nulls)."""
    if not (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)) or not pa.types.is_struct(
            arr.type.value_type):
        raise SchemaError(f"column {struct_schema.name!r}: a struct array needs list<struct> values, got {arr.type}")
    lengths = pc.list_value_length(arr).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int32)
    offsets = np.zeros(len(arr) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    flat = arr.flatten()
    mask = pa.array(arr.is_null().to_numpy(zero_copy_only=False)) if arr.null_count else None
    out = []
    for sub in struct_schema.fields:
        raw = raw_sub_name(struct_schema.name, sub.name)
        idx = flat.type.get_field_index(raw)
        if idx < 0:
            raise SchemaError(f"column {struct_schema.name!r}: the struct has no field {raw!r}")
        col = pa.ListArray.from_arrays(pa.array(offsets), flat.field(idx), mask=mask)
        out.append(C.arrow_to_field_data(col, sub))
    return out
