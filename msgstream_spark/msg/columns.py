"""Column conversion between Milvus ``schema.FieldData`` and Arrow arrays (wire doc §8.3).

Numeric and vector columns move through numpy buffers: no per-row Python. Strings,
JSON, Array and sparse rows need per-row objects on the protobuf side, which is kept lean.
Arrow types (what Spark sees) are listed in docs/internals.md.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from msgstream_spark.errors import SchemaError
from msgstream_spark.msg.pb import schema_pb2
from msgstream_spark.msg.wire import encode_varint

# DataType numbers (schema.proto)
BOOL, INT8, INT16, INT32, INT64, FLOAT, DOUBLE = 1, 2, 3, 4, 5, 10, 11
STRING, VARCHAR, ARRAY, JSON = 20, 21, 22, 23
GEOMETRY, TEXT, TIMESTAMPTZ = 24, 25, 26  # Milvus 2.6 / 3.0 (docs/spark-source.md, type table)
BINARY_VECTOR, FLOAT_VECTOR, FLOAT16_VECTOR, BFLOAT16_VECTOR, SPARSE_VECTOR, INT8_VECTOR = 100, 101, 102, 103, 104, 105
ARRAY_OF_VECTOR, ARRAY_OF_STRUCT = 106, 200
DENSE_VECTORS = (FLOAT_VECTOR, FLOAT16_VECTOR, BFLOAT16_VECTOR, INT8_VECTOR, BINARY_VECTOR)
TIMESTAMP_US_UTC = pa.timestamp("us", tz="UTC")

_SCALAR_ARROW = {BOOL: pa.bool_(), INT8: pa.int8(), INT16: pa.int16(), INT32: pa.int32(), INT64: pa.int64(),
                 FLOAT: pa.float32(), DOUBLE: pa.float64(), STRING: pa.string(), VARCHAR: pa.string(),
                 JSON: pa.string(), TEXT: pa.string(), GEOMETRY: pa.binary(), TIMESTAMPTZ: TIMESTAMP_US_UTC}
_NUMPY = {BOOL: np.bool_, INT8: np.int8, INT16: np.int16, INT32: np.int32, INT64: np.int64,
          FLOAT: np.float32, DOUBLE: np.float64}
# ScalarField oneof member per data type
_SCALAR_SLOT = {BOOL: "bool_data", INT8: "int_data", INT16: "int_data", INT32: "int_data", INT64: "long_data",
                FLOAT: "float_data", DOUBLE: "double_data", STRING: "string_data", VARCHAR: "string_data",
                JSON: "json_data", TEXT: "string_data", GEOMETRY: "geometry_data", TIMESTAMPTZ: "timestamptz_data"}
# Array elements Milvus accepts (proxy util.go validateElementType)
_ARRAY_ELEMENTS = (BOOL, INT8, INT16, INT32, INT64, FLOAT, DOUBLE, STRING, VARCHAR)
_SPARSE_DTYPE = np.dtype([("i", "<u4"), ("v", "<f4")])


def type_name(t: int) -> str:
    try:
        return schema_pb2.DataType.Name(int(t))
    except ValueError:
        return str(t)


def arrow_type_for(field_schema: Any) -> pa.DataType:
    """Arrow type of a ``schema.FieldSchema`` (or of a bare DataType number).

    A type this version does not know (Mol, Date, Time, Decimal, UUID: in the protobufs, written
    by no released Milvus) is a SchemaError naming the type number and the field.
    """
    if isinstance(field_schema, int):
        t, elem, name = field_schema, 0, ""
    else:
        t, elem, name = int(field_schema.data_type), int(field_schema.element_type), field_schema.name
    where = f" (field {name!r})" if name else ""
    if t in _SCALAR_ARROW:
        return _SCALAR_ARROW[t]
    if t == ARRAY:
        if elem not in _ARRAY_ELEMENTS:
            raise SchemaError(f"Array element type {type_name(elem)} is not supported{where}")
        return pa.list_(_SCALAR_ARROW[elem])
    if t in (FLOAT_VECTOR, FLOAT16_VECTOR, BFLOAT16_VECTOR):
        return pa.list_(pa.float32())
    if t == INT8_VECTOR:
        return pa.list_(pa.int8())
    if t == BINARY_VECTOR:
        return pa.binary()
    if t == SPARSE_VECTOR:
        return pa.map_(pa.int64(), pa.float32())
    if t == ARRAY_OF_VECTOR:
        if elem not in DENSE_VECTORS:
            raise SchemaError(f"ArrayOfVector element type {type_name(elem)} is not supported{where}")
        return pa.list_(arrow_type_for(elem))
    raise SchemaError(f"Milvus data type {type_name(t)} ({t}) is not supported by this version{where}")


def is_known_type(t: int) -> bool:
    """Whether FieldData of DataType ``t`` decodes (ArrayOfStruct never reaches the WAL: flattened)."""
    return t in _SCALAR_ARROW or t in (ARRAY, SPARSE_VECTOR, ARRAY_OF_VECTOR) or t in DENSE_VECTORS


# -- FieldData -> Arrow ---------------------------------------------------------------------
def numpy_to_packed(target: Any, values: np.ndarray) -> None:
    """Fill a FloatArray/DoubleArray from numpy by parsing packed bytes (no Python floats)."""

    data = np.ascontiguousarray(values).astype(values.dtype.newbyteorder("<"), copy=False).tobytes()
    target.MergeFromString(b"\x0a" + encode_varint(len(data)) + data if data else b"")


def _np(container: Any, dtype: Any) -> np.ndarray:
    return np.array(container, dtype=dtype) if len(container) else np.zeros(0, dtype=dtype)


def _list_from_flat(values: np.ndarray, n: int, dim: int) -> pa.Array:
    if n == 0:
        return pa.array([], pa.list_(pa.from_numpy_dtype(values.dtype)))
    if dim <= 0 or values.size != n * dim:
        raise ValueError(f"vector data has {values.size} values, not {n} rows x dim {dim}")
    offsets = pa.py_buffer(np.arange(0, (n + 1) * dim, dim, dtype=np.int32))
    child = pa.array(values)
    return pa.Array.from_buffers(pa.list_(child.type), n, [None, offsets], children=[child])


def _scalar_to_arrow(t: int, sf: Any) -> pa.Array:
    slot = _SCALAR_SLOT.get(t)
    if slot is None:
        raise SchemaError(f"unsupported scalar type {type_name(t)}")
    data = getattr(sf, slot).data
    if t in _NUMPY:
        return pa.array(_np(data, _NUMPY[t]))
    if t == JSON:
        return pa.array(list(data), pa.binary()).cast(pa.string())
    if t == TIMESTAMPTZ:  # int64 microseconds since the epoch, a UTC instant (proxy: ParseTimeTz -> UnixMicro)
        if not len(data) and len(sf.string_data.data):
            raise SchemaError("Timestamptz data holds strings (the client form); the WAL form is int64 microseconds")
        return pa.array(_np(data, np.int64)).cast(TIMESTAMP_US_UTC)
    if t == GEOMETRY:  # ISO WKB (proxy: ConvertWKTToWKB); null rows hold empty bytes
        if not len(data) and len(sf.geometry_wkt_data.data):
            raise SchemaError("Geometry data holds WKT strings (the client form); the WAL form is WKB bytes")
        return pa.array(list(data), pa.binary())
    return pa.array(list(data), pa.string())


# The element type an Array row's populated ScalarField slot implies (Int8/Int16 also use int_data).
_SLOT_ELEMENT = {"bool_data": BOOL, "int_data": INT32, "long_data": INT64, "float_data": FLOAT,
                 "double_data": DOUBLE, "string_data": VARCHAR}


def array_element_type(fd: Any) -> int:
    """Element type of an Array FieldData: ``array_data.element_type``, else what its rows hold.

    Milvus 2.3.5 leaves ``element_type`` at 0 in InsertRequest (the type is only in the
    CreateCollection schema); the rows still sit in one slot (``long_data``, ``string_data``...),
    which gives the type up to integer width, and the reader casts to the schema's type.
    0 when neither says (every row empty).
    """
    arr = fd.scalars.array_data
    elem = int(arr.element_type)
    if elem:
        return elem
    for sf in arr.data:
        slot = sf.WhichOneof("data")
        if slot is not None:
            return _SLOT_ELEMENT.get(slot, 0)
    return 0


def _array_to_arrow(fd: Any) -> pa.Array:
    arr = fd.scalars.array_data
    elem = array_element_type(fd)
    if elem == 0:  # no type anywhere and no values: empty lists (cast to the schema's type later)
        return pa.ListArray.from_arrays(pa.array(np.zeros(len(arr.data) + 1, np.int32)), pa.nulls(0))
    slot = _SCALAR_SLOT.get(elem)
    if slot is None or elem == JSON:
        raise SchemaError(f"Array element type {type_name(elem)} is not supported")
    rows = [getattr(sf, slot).data for sf in arr.data]
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int32, count=len(rows))
    offsets = np.zeros(len(rows) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    if elem in _NUMPY:
        flat = [x for r in rows for x in r]
        values = pa.array(np.array(flat, dtype=_NUMPY[elem]) if flat else np.zeros(0, _NUMPY[elem]))
    else:
        values = pa.array([x for r in rows for x in r], pa.string())
    return pa.ListArray.from_arrays(pa.array(offsets), values)


def _vector_to_arrow(t: int, vf: Any, n_hint: int | None = None) -> pa.Array:
    dim = int(vf.dim)
    if t == FLOAT_VECTOR:
        values = _np(vf.float_vector.data, np.float32)
        n = values.size // dim if dim else 0
        return _list_from_flat(values, n, dim)
    if t in (FLOAT16_VECTOR, BFLOAT16_VECTOR):
        raw = vf.float16_vector if t == FLOAT16_VECTOR else vf.bfloat16_vector
        if t == FLOAT16_VECTOR:
            values = np.frombuffer(raw, dtype="<f2").astype(np.float32)
        else:
            values = (np.frombuffer(raw, dtype="<u2").astype(np.uint32) << np.uint32(16)).view(np.float32)
        n = values.size // dim if dim else 0
        return _list_from_flat(values, n, dim)
    if t == INT8_VECTOR:
        values = np.frombuffer(vf.int8_vector, dtype=np.int8)
        n = values.size // dim if dim else 0
        return _list_from_flat(values, n, dim)
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
        pairs = np.frombuffer(b"".join(contents), dtype=_SPARSE_DTYPE)
        offsets = np.zeros(len(contents) + 1, dtype=np.int32)
        np.cumsum(lengths // 8, out=offsets[1:])
        return pa.MapArray.from_arrays(pa.array(offsets), pa.array(pairs["i"].astype(np.int64)),
                                       pa.array(pairs["v"].astype(np.float32)))
    raise SchemaError(f"unsupported vector type {type_name(t)}")


def field_data_to_arrow(fd: Any) -> pa.Array:
    """One FieldData column as an Arrow array; ``valid_data`` becomes Arrow nulls.

    Nullable scalars come expanded (a zero value at each null row); nullable vectors of
    Milvus 3.0 / 2.6.17+ come compact (payload rows = the valid rows only): both give one
    Arrow row per ``valid_data`` entry, null where it is false.
    """
    t = int(fd.type)
    which = fd.WhichOneof("field")
    if not is_known_type(t):
        raise SchemaError(f"field {fd.field_name!r} (id {fd.field_id}) has Milvus data type {type_name(t)} ({t}), "
                          "which this version does not decode")
    if t == ARRAY:
        arr = _array_to_arrow(fd)
    elif t == ARRAY_OF_VECTOR:
        from msgstream_spark.msg.structs import vector_array_to_arrow

        arr = vector_array_to_arrow(fd.vectors.vector_array)
    elif which == "vectors" or t >= 100:
        arr = _vector_to_arrow(t, fd.vectors)
    else:
        arr = _scalar_to_arrow(t, fd.scalars)
    if len(fd.valid_data):
        arr = _apply_valid(arr, _np(fd.valid_data, np.bool_), fd.field_name)
    return arr


def _apply_valid(arr: pa.Array, valid: np.ndarray, name: str) -> pa.Array:
    """Nulls where ``valid`` is false: in place for expanded data, spread out for compact data."""
    if valid.size == len(arr):
        return arr if valid.all() else pc.if_else(pa.array(valid), arr, pa.nulls(len(arr), arr.type))
    if int(valid.sum()) == len(arr):  # compact: payload row i is the i-th valid row
        idx = np.cumsum(valid, dtype=np.int64) - 1
        return arr.take(pa.array(idx, mask=~valid))
    raise ValueError(f"field {name!r}: valid_data has {valid.size} entries ({int(valid.sum())} valid) "
                     f"for {len(arr)} payload rows")


def _whole(n: int, unit: int) -> int:
    """Rows in ``n`` values of ``unit`` each; -1 when they are not a whole number of rows."""
    return n // unit if unit > 0 and n % unit == 0 else -1


def field_data_rows(fd: Any) -> int:
    """Row count of a FieldData without building arrays; -1 when it cannot be read as whole rows
    (a vector whose length is not a multiple of its dimension, a dimension <= 0, an unknown type,
    ``valid_data`` matching neither all rows nor the valid ones)."""
    rows = _payload_rows(fd)
    n = len(fd.valid_data)
    if not n or rows < 0:
        return rows
    if rows == n or rows == sum(fd.valid_data):  # expanded, or compact (nullable vectors)
        return n
    return -1


def _payload_rows(fd: Any) -> int:
    t = int(fd.type)
    if t == ARRAY_OF_VECTOR:
        return len(fd.vectors.vector_array.data)
    if fd.WhichOneof("field") == "vectors" or t >= 100:
        vf = fd.vectors
        dim = int(vf.dim)
        if t == FLOAT_VECTOR:
            return _whole(len(vf.float_vector.data), dim)
        if t in (FLOAT16_VECTOR, BFLOAT16_VECTOR):
            raw = vf.float16_vector if t == FLOAT16_VECTOR else vf.bfloat16_vector
            return _whole(len(raw), 2 * dim)
        if t == INT8_VECTOR:
            return _whole(len(vf.int8_vector), dim)
        if t == BINARY_VECTOR:
            return _whole(len(vf.binary_vector), dim // 8 if dim % 8 == 0 else 0)
        if t == SPARSE_VECTOR:
            return len(vf.sparse_float_vector.contents)
        return -1
    if t == ARRAY:
        return len(fd.scalars.array_data.data)
    slot = _SCALAR_SLOT.get(t)
    return len(getattr(fd.scalars, slot).data) if slot else -1


# -- Arrow -> FieldData ---------------------------------------------------------------------
def _dim_of(field_schema: Any) -> int | None:
    for p in field_schema.type_params:
        if p.key == "dim" and p.value:
            return int(p.value)
    return None


def _list_parts(arr: pa.Array, name: str) -> tuple[np.ndarray, pa.Array]:
    """(row lengths, flat values) of a list / large_list / fixed_size_list array."""
    if pa.types.is_fixed_size_list(arr.type):
        n = len(arr)
        lengths = np.full(n, arr.type.list_size, dtype=np.int64)
        return lengths, arr.flatten()
    if not (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)):
        raise SchemaError(f"column {name!r}: expected a list of numbers for a vector, got {arr.type}")
    lengths = pc.list_value_length(arr).fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    return lengths, arr.flatten()


def _fixed_dim(lengths: np.ndarray, dim: int | None, name: str) -> int:
    if lengths.size == 0:
        return dim or 0
    d = int(lengths[0]) if dim is None else dim
    bad = np.nonzero(lengths != d)[0]
    if bad.size:
        raise SchemaError(f"column {name!r}: row {int(bad[0])} has dimension {int(lengths[bad[0]])}, expected {d}")
    if d <= 0:
        raise SchemaError(f"column {name!r}: vectors must have dimension > 0")
    return d


def arrow_to_field_data(arr: pa.Array | pa.ChunkedArray, field_schema: Any) -> Any:
    """An Arrow column as the ``schema.FieldData`` of ``field_schema`` (a ``schema.FieldSchema``).

    Null slots of a nullable field hold zero values plus ``valid_data``; nulls in a
    non-nullable field, wrong vector dimensions and unsupported types are SchemaErrors
    naming the column.
    """

    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    name = field_schema.name
    t = int(field_schema.data_type)
    fd = schema_pb2.FieldData(type=t, field_name=name, field_id=int(field_schema.fieldID),
                              is_dynamic=bool(field_schema.is_dynamic))
    if arr.null_count:
        if not field_schema.nullable:
            first = int(np.nonzero(arr.is_null().to_numpy(zero_copy_only=False))[0][0])
            raise SchemaError(f"column {name!r} is not nullable but row {first} is null")
        if t >= 100 and t != ARRAY_OF_VECTOR:
            raise SchemaError(f"column {name!r}: vector fields cannot hold nulls")
        fd.valid_data.extend(arr.is_valid().to_numpy(zero_copy_only=False).tolist())
    if t in _NUMPY:
        zero = False if t == BOOL else 0
        target = _SCALAR_ARROW[t]
        try:
            col = arr.cast(target) if arr.type != target else arr
        except pa.ArrowInvalid as exc:
            raise SchemaError(f"column {name!r}: values do not fit {type_name(t)}: {exc}") from exc
        values = col.fill_null(zero).to_numpy(zero_copy_only=False)
        if t in (FLOAT, DOUBLE):
            numpy_to_packed(getattr(fd.scalars, _SCALAR_SLOT[t]), values)
        else:
            getattr(fd.scalars, _SCALAR_SLOT[t]).data.extend(values.tolist())
    elif t in (STRING, VARCHAR, TEXT):
        fd.scalars.string_data.data.extend(arr.cast(pa.string()).fill_null("").to_pylist())
    elif t == TIMESTAMPTZ:
        _timestamptz_from_arrow(arr, name, fd)
    elif t == GEOMETRY:
        if not (pa.types.is_binary(arr.type) or pa.types.is_large_binary(arr.type)):
            raise SchemaError(f"column {name!r}: a Geometry field needs WKB binary values, got {arr.type} "
                              "(WKT text converts with e.g. shapely.wkt.loads(s).wkb)")
        fd.scalars.geometry_data.data.extend(arr.cast(pa.binary()).fill_null(b"").to_pylist())
    elif t == ARRAY_OF_VECTOR:
        from msgstream_spark.msg.structs import vector_array_from_arrow

        vector_array_from_arrow(arr, field_schema, fd)
    elif t == JSON:
        col = arr if pa.types.is_binary(arr.type) else arr.cast(pa.string()).cast(pa.binary())
        fd.scalars.json_data.data.extend(col.fill_null(b"").to_pylist())
    elif t == ARRAY:
        _array_from_arrow(arr, field_schema, fd)
    elif t in (FLOAT_VECTOR, FLOAT16_VECTOR, BFLOAT16_VECTOR, INT8_VECTOR):
        _dense_vectors_from_arrow(arr, field_schema, fd, t)
    elif t == BINARY_VECTOR:
        if not (pa.types.is_binary(arr.type) or pa.types.is_large_binary(arr.type)
                or pa.types.is_fixed_size_binary(arr.type)):
            raise SchemaError(f"column {name!r}: a BinaryVector needs binary values, got {arr.type}")
        lengths = pc.binary_length(arr).to_numpy(zero_copy_only=False).astype(np.int64)
        dim_bits = _dim_of(field_schema)
        width = _fixed_dim(lengths, dim_bits // 8 if dim_bits else None, name)
        fd.vectors.dim = width * 8
        fd.vectors.binary_vector = b"".join(arr.to_pylist())
    elif t == SPARSE_VECTOR:
        _sparse_from_arrow(arr, name, fd)
    else:
        raise SchemaError(f"column {name!r}: Milvus type {type_name(t)} is not supported")
    return fd


def _timestamptz_from_arrow(arr: pa.Array, name: str, fd: Any) -> None:
    """Timestamptz as Milvus stores it: int64 microseconds since the epoch (UTC; naive times are UTC)."""
    if not pa.types.is_timestamp(arr.type):
        raise SchemaError(f"column {name!r}: a Timestamptz field needs timestamp values, got {arr.type}")
    us = pc.cast(arr, pa.timestamp("us", tz=arr.type.tz), safe=False).cast(pa.int64())  # ns: truncated to us
    fd.scalars.timestamptz_data.data.extend(us.fill_null(0).to_numpy(zero_copy_only=False).tolist())


def _dense_vectors_from_arrow(arr: pa.Array, field_schema: Any, fd: Any, t: int) -> None:
    """Float / Float16 / BFloat16 / Int8 vectors: list columns of one fixed dimension."""
    lengths, flat = _list_parts(arr, field_schema.name)
    fd.vectors.dim = _fixed_dim(lengths, _dim_of(field_schema), field_schema.name)
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


def _array_from_arrow(arr: pa.Array, field_schema: Any, fd: Any) -> None:
    elem = int(field_schema.element_type)
    slot = _SCALAR_SLOT.get(elem)
    if slot is None or elem == JSON:
        raise SchemaError(f"column {field_schema.name!r}: Array element type {type_name(elem)} is not supported")
    fd.scalars.array_data.element_type = elem
    rows = arr.to_pylist()
    out = fd.scalars.array_data.data
    for r in rows:
        sf = schema_pb2.ScalarField()
        getattr(sf, slot).data.extend(r or [])
        out.append(sf)


def _sparse_from_arrow(arr: pa.Array, name: str, fd: Any) -> None:
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
    pairs = np.empty(keys.size, dtype=_SPARSE_DTYPE)
    pairs["i"] = keys
    pairs["v"] = vals
    buf = pairs.tobytes()
    bounds = (offsets - base) * 8
    fd.vectors.sparse_float_vector.contents.extend(
        [buf[bounds[i]:bounds[i + 1]] for i in range(len(lengths))])
    dim = int(keys.max()) + 1 if keys.size else 0
    fd.vectors.sparse_float_vector.dim = dim
    fd.vectors.dim = dim
