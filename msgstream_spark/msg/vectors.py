"""Vector columns between ``schema.VectorField`` and Arrow, through numpy buffers (no per-row Python).

Dense vectors are ``list<float32>`` (Float, Float16, BFloat16), ``list<int8>`` (Int8) or ``binary``
(Binary); sparse ones ``map<int64, float32>``. A vector array (ArrayOfVector, a struct's vector
sub-field) is one VectorField per row holding its vectors back to back: ``list<vector>``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from msgstream_spark.errors import SchemaError
from msgstream_spark.msg.dtypes import (
    BFLOAT16_VECTOR,
    BINARY_VECTOR,
    FLOAT16_VECTOR,
    FLOAT_VECTOR,
    INT8_VECTOR,
    SPARSE_VECTOR,
    arrow_type_for,
    type_name,
)
from msgstream_spark.msg.pb import schema_pb2
from msgstream_spark.msg.wire import encode_varint

SPARSE_DTYPE = np.dtype([("i", "<u4"), ("v", "<f4")])


def numpy_to_packed(target: Any, values: np.ndarray) -> None:
    """Fill a FloatArray/DoubleArray from numpy by parsing packed bytes (no Python floats)."""

    data = np.ascontiguousarray(values).astype(values.dtype.newbyteorder("<"), copy=False).tobytes()
    target.MergeFromString(b"\x0a" + encode_varint(len(data)) + data if data else b"")


def np_values(container: Any, dtype: Any) -> np.ndarray:
    return np.array(container, dtype=dtype) if len(container) else np.zeros(0, dtype=dtype)


def list_from_flat(values: np.ndarray, n: int, dim: int) -> pa.Array:
    if n == 0:
        return pa.array([], pa.list_(pa.from_numpy_dtype(values.dtype)))
    if dim <= 0 or values.size != n * dim:
        raise ValueError(f"vector data has {values.size} values, not {n} rows x dim {dim}")
    offsets = pa.py_buffer(np.arange(0, (n + 1) * dim, dim, dtype=np.int32))
    child = pa.array(values)
    return pa.Array.from_buffers(pa.list_(child.type), n, [None, offsets], children=[child])


def vector_to_arrow(t: int, vf: Any, n_hint: int | None = None) -> pa.Array:
    dim = int(vf.dim)
    if t == FLOAT_VECTOR:
        values = np_values(vf.float_vector.data, np.float32)
        n = values.size // dim if dim else 0
        return list_from_flat(values, n, dim)
    if t in (FLOAT16_VECTOR, BFLOAT16_VECTOR):
        raw = vf.float16_vector if t == FLOAT16_VECTOR else vf.bfloat16_vector
        if t == FLOAT16_VECTOR:
            values = np.frombuffer(raw, dtype="<f2").astype(np.float32)
        else:
            values = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << np.uint32(16)).view(np.float32)
        n = values.size // dim if dim else 0
        return list_from_flat(values, n, dim)
    if t == INT8_VECTOR:
        values = np.frombuffer(vf.int8_vector, dtype=np.int8)
        n = values.size // dim if dim else 0
        return list_from_flat(values, n, dim)
    if t == BINARY_VECTOR:
        width = dim // 8
        raw = vf.binary_vector
        n = len(raw) // width if width else 0
        if width == 0 or len(raw) != n * width:
            raise ValueError(f"binary vector data has {len(raw)} bytes, not a multiple of dim/8={width}")
        offsets = pa.py_buffer(np.arange(0, (n + 1) * width, width, dtype=np.int32).tobytes())
        return pa.Array.from_buffers(pa.binary(), n, [None, offsets, pa.py_buffer(raw)])
    if t == SPARSE_VECTOR:
        contents = vf.sparse_float_vector.contents
        lengths = np.fromiter((len(c) for c in contents), dtype=np.int64, count=len(contents))
        if np.any(lengths % 8):
            raise ValueError("sparse vector row length is not a multiple of 8 bytes")
        pairs = np.frombuffer(b"".join(contents), dtype=SPARSE_DTYPE)
        offsets = np.zeros(len(contents) + 1, dtype=np.int32)
        np.cumsum(lengths // 8, out=offsets[1:])
        return pa.MapArray.from_arrays(pa.array(offsets), pa.array(pairs["i"].astype(np.int64)),
                                       pa.array(pairs["v"].astype(np.float32)))
    raise SchemaError(f"unsupported vector type {type_name(t)}")


def dim_of(field_schema: Any) -> int | None:
    for p in field_schema.type_params:
        if p.key == "dim" and p.value:
            return int(p.value)
    return None


def list_parts(arr: pa.Array, name: str) -> tuple[np.ndarray, pa.Array]:
    """(row lengths, flat values) of a list / large_list / fixed_size_list array."""
    if pa.types.is_fixed_size_list(arr.type):
        n = len(arr)
        lengths = np.full(n, arr.type.list_size, dtype=np.int64)
        return lengths, arr.flatten()
    if not (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)):
        raise SchemaError(f"column {name!r}: expected a list of numbers for a vector, got {arr.type}")
    lengths = pc.list_value_length(arr).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    return lengths, arr.flatten()


def fixed_dim(lengths: np.ndarray, dim: int | None, name: str) -> int:
    if lengths.size == 0:
        return dim or 0
    d = int(lengths[0]) if dim is None else dim
    bad = np.nonzero(lengths != d)[0]
    if bad.size:
        raise SchemaError(f"column {name!r}: row {int(bad[0])} has dimension {int(lengths[bad[0]])}, expected {d}")
    if d <= 0:
        raise SchemaError(f"column {name!r}: vectors must have dimension > 0")
    return d


def dense_vectors_from_arrow(arr: pa.Array, field_schema: Any, fd: Any, t: int) -> None:
    """Float / Float16 / BFloat16 / Int8 vectors: list columns of one fixed dimension."""
    lengths, flat = list_parts(arr, field_schema.name)
    fd.vectors.dim = fixed_dim(lengths, dim_of(field_schema), field_schema.name)
    if t == INT8_VECTOR:
        fd.vectors.int8_vector = flat.cast(pa.int8()).to_numpy(zero_copy_only=False).tobytes()
        return
    f32 = flat.cast(pa.float32()).to_numpy(zero_copy_only=False)
    if t == FLOAT_VECTOR:
        numpy_to_packed(fd.vectors.float_vector, f32)
    elif t == FLOAT16_VECTOR:
        fd.vectors.float16_vector = f32.astype("<f2").tobytes()
    else:  # BFloat16: round to nearest even on the high 16 bits
        u = f32.view(np.uint32)
        rounded = (u + np.uint32(0x7FFF) + ((u >> np.uint32(16)) & np.uint32(1))) >> np.uint32(16)
        fd.vectors.bfloat16_vector = rounded.astype("<u2").tobytes()


def binary_vectors_from_arrow(arr: pa.Array, field_schema: Any, fd: Any) -> None:
    """BinaryVector rows: binary values of one width (dim / 8 bytes)."""
    name = field_schema.name
    if not (pa.types.is_binary(arr.type) or pa.types.is_large_binary(arr.type)
            or pa.types.is_fixed_size_binary(arr.type)):
        raise SchemaError(f"column {name!r}: a BinaryVector needs binary values, got {arr.type}")
    lengths = pc.binary_length(arr).to_numpy(zero_copy_only=False).astype(np.int64)
    dim_bits = dim_of(field_schema)
    width = fixed_dim(lengths, dim_bits // 8 if dim_bits else None, name)
    fd.vectors.dim = width * 8
    fd.vectors.binary_vector = b"".join(arr.to_pylist())


def sparse_from_arrow(arr: pa.Array, name: str, fd: Any) -> None:
    if not pa.types.is_map(arr.type):
        raise SchemaError(f"column {name!r}: a SparseFloatVector needs map<int, float> values, got {arr.type}")
    offsets = arr.offsets.to_numpy(zero_copy_only=False).astype(np.int64)
    base = offsets[0]
    keys = arr.keys.to_numpy(zero_copy_only=False).astype(np.int64)
    vals = arr.items.cast(pa.float32()).to_numpy(zero_copy_only=False)
    if keys.size and (keys.min() < 0 or keys.max() >= 2**32 - 1):
        raise SchemaError(f"column {name!r}: sparse indices must be in [0, 2^32-2]")
    if vals.size and (np.isnan(vals).any() or (vals < 0).any()):
        raise SchemaError(f"column {name!r}: sparse values must be non-negative numbers")
    lengths = np.diff(offsets)
    row_of = np.repeat(np.arange(len(lengths)), lengths)
    order = np.lexsort((keys, row_of))
    keys, vals = keys[order], vals[order]
    if keys.size > 1:
        dup = (np.diff(keys) == 0) & (np.diff(row_of) == 0)
        if dup.any():
            raise SchemaError(f"column {name!r}: row {int(row_of[1:][dup][0])} repeats a sparse index")
    pairs = np.empty(keys.size, dtype=SPARSE_DTYPE)
    pairs["i"] = keys
    pairs["v"] = vals
    buf = pairs.tobytes()
    bounds = (offsets - base) * 8
    fd.vectors.sparse_float_vector.contents.extend(
        [buf[bounds[i]:bounds[i + 1]] for i in range(len(lengths))])
    dim = int(keys.max()) + 1 if keys.size else 0
    fd.vectors.sparse_float_vector.dim = dim
    fd.vectors.dim = dim


# -- vector arrays (ArrayOfVector) ------------------------------------------------------------
_VEC_SLOT = {FLOAT_VECTOR: "float_vector", BINARY_VECTOR: "binary_vector", FLOAT16_VECTOR: "float16_vector",
             BFLOAT16_VECTOR: "bfloat16_vector", INT8_VECTOR: "int8_vector"}
_SLOT_VEC = {v: k for k, v in _VEC_SLOT.items()}


def _width(elem: int, dim: int) -> int:
    """Payload units per vector: floats for FloatVector, bytes for the others (proxy ``vectorArrayElementWidth``)."""
    if elem in (FLOAT_VECTOR, INT8_VECTOR):
        return dim
    if elem == BINARY_VECTOR:
        return (dim + 7) // 8
    return 2 * dim


def vector_array_to_arrow(va: Any) -> pa.Array:
    """A ``VectorArray`` (one VectorField per row) as ``list<vector>``."""
    rows = va.data
    elem = int(va.element_type) or next((_SLOT_VEC.get(r.WhichOneof("data"), 0) for r in rows
                                         if r.WhichOneof("data")), 0)
    if not elem and not sum(r.ByteSize() for r in rows):  # no type anywhere and no vectors
        return pa.array([[] for _ in rows], pa.list_(pa.list_(pa.float32())))
    if elem not in _VEC_SLOT:
        raise SchemaError(f"ArrayOfVector element type {type_name(elem)} ({elem}) is not supported")
    dim = int(va.dim) or next((int(r.dim) for r in rows if r.dim), 0)
    combined = schema_pb2.VectorField(dim=dim)
    if elem == FLOAT_VECTOR:
        parts = [np_values(r.float_vector.data, np.float32) for r in rows]
        sizes = np.array([p.size for p in parts], dtype=np.int64)
        if parts:
            numpy_to_packed(combined.float_vector, np.concatenate(parts))
    else:
        slot = _VEC_SLOT[elem]
        parts = [getattr(r, slot) for r in rows]
        sizes = np.array([len(p) for p in parts], dtype=np.int64)
        setattr(combined, slot, b"".join(parts))
    offsets = np.zeros(len(rows) + 1, dtype=np.int32)
    if not sizes.sum():
        return pa.ListArray.from_arrays(pa.array(offsets), pa.array([], arrow_type_for(elem)))
    width = _width(elem, dim)
    bad = np.nonzero(sizes % width)[0] if width > 0 else np.arange(len(rows))
    if bad.size:
        raise ValueError(f"vector array row {int(bad[0])} holds {int(sizes[bad[0]])} values, not whole "
                         f"{type_name(elem)} vectors of dim {dim}")
    np.cumsum(sizes // width, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), vector_to_arrow(elem, combined))


def vector_array_from_arrow(arr: pa.Array, field_schema: Any, fd: Any) -> None:
    """``list<vector>`` rows into ``fd.vectors.vector_array`` (a null row becomes an empty VectorField)."""
    name, elem = field_schema.name, int(field_schema.element_type)
    if elem not in _VEC_SLOT:
        raise SchemaError(f"column {name!r}: ArrayOfVector element type {type_name(elem)} is not supported")
    if not (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type) or pa.types.is_fixed_size_list(arr.type)):
        raise SchemaError(f"column {name!r}: an ArrayOfVector needs a list of vectors, got {arr.type}")
    counts = pc.list_value_length(arr).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    inner_schema = schema_pb2.FieldSchema(name=name, data_type=elem)
    inner_schema.type_params.extend(field_schema.type_params)
    flat = schema_pb2.FieldData()
    if elem == BINARY_VECTOR:
        binary_vectors_from_arrow(arr.flatten(), inner_schema, flat)
    else:
        dense_vectors_from_arrow(arr.flatten(), inner_schema, flat, elem)
    dim = int(flat.vectors.dim)
    va = fd.vectors.vector_array
    va.dim, va.element_type = dim, elem
    bounds = np.concatenate(([0], np.cumsum(counts)))
    if elem == FLOAT_VECTOR:
        values = np_values(flat.vectors.float_vector.data, np.float32)
        for a, b in zip(bounds[:-1], bounds[1:]):
            row = va.data.add(dim=dim)
            numpy_to_packed(row.float_vector, values[a * dim:b * dim])
        return
    slot, width = _VEC_SLOT[elem], _width(elem, dim)
    raw = getattr(flat.vectors, slot)
    for a, b in zip(bounds[:-1], bounds[1:]):
        setattr(va.data.add(dim=dim), slot, raw[a * width:b * width])


def vector_array_kind(va: Any) -> tuple[int, int]:
    """(element vector type, dim) of a VectorArray: its own fields, else its rows' (FloatVector if none)."""
    elem = int(va.element_type) or next((_SLOT_VEC.get(r.WhichOneof("data"), 0) for r in va.data
                                         if r.WhichOneof("data")), FLOAT_VECTOR)
    return elem, int(va.dim) or next((int(r.dim) for r in va.data if r.dim), 0)
