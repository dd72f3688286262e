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
from google.protobuf.unknown_fields import UnknownFieldSet

from msgstream_spark.errors import SchemaError
from msgstream_spark.msg.dtypes import (  # noqa: F401 - the names callers import from here
    ARRAY,
    ARRAY_ELEMENTS,
    ARRAY_OF_STRUCT,
    ARRAY_OF_VECTOR,
    BFLOAT16_VECTOR,
    BINARY_VECTOR,
    BOOL,
    DENSE_VECTORS,
    DOUBLE,
    FLOAT,
    FLOAT16_VECTOR,
    FLOAT_VECTOR,
    GEOMETRY,
    INT8,
    INT8_VECTOR,
    INT16,
    INT32,
    INT64,
    JSON,
    NUMPY,
    SCALAR_ARROW,
    SCALAR_SLOT,
    SLOT_ELEMENT,
    SPARSE_VECTOR,
    STRING,
    TEXT,
    TIMESTAMP_US_UTC,
    TIMESTAMPTZ,
    VARCHAR,
    arrow_type_for,
    is_known_type,
    type_name,
)
from msgstream_spark.msg.pb import schema_pb2
from msgstream_spark.msg.vectors import (
    binary_vectors_from_arrow,
    dense_vectors_from_arrow,
    list_from_flat,
    np_values,
    numpy_to_packed,
    sparse_from_arrow,
    vector_array_from_arrow,
    vector_array_to_arrow,
    vector_to_arrow,
)


def _scalar_to_arrow(t: int, sf: Any) -> pa.Array:
    slot = SCALAR_SLOT.get(t)
    if slot is None:
        raise SchemaError(f"unsupported scalar type {type_name(t)}")
    data = getattr(sf, slot).data
    if t in NUMPY:
        return pa.array(np_values(data, NUMPY[t]))
    if t == JSON:
        return pa.array(list(data), pa.binary()).cast(pa.string())
    if t == TIMESTAMPTZ:  # int64 microseconds since the epoch, a UTC instant (proxy: ParseTimeTz -> UnixMicro)
        if not len(data) and len(sf.string_data.data):
            raise SchemaError("Timestamptz data holds strings (the client form); the WAL form is int64 microseconds")
        return pa.array(np_values(data, np.int64)).cast(TIMESTAMP_US_UTC)
    if t == GEOMETRY:  # ISO WKB (proxy: ConvertWKTToWKB); null rows hold empty bytes
        if not len(data) and len(sf.geometry_wkt_data.data):
            raise SchemaError("Geometry data holds WKT strings (the client form); the WAL form is WKB bytes")
        return pa.array(list(data), pa.binary())
    return pa.array(list(data), pa.string())


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
            return SLOT_ELEMENT.get(slot, 0)
    return 0


def _array_to_arrow(fd: Any) -> pa.Array:
    arr = fd.scalars.array_data
    elem = array_element_type(fd)
    if elem == 0:  # no type anywhere and no values: empty lists (cast to the schema's type later)
        return pa.ListArray.from_arrays(pa.array(np.zeros(len(arr.data) + 1, np.int32)), pa.nulls(0))
    slot = SCALAR_SLOT.get(elem)
    if slot is None or elem == JSON:
        raise SchemaError(f"Array element type {type_name(elem)} is not supported")
    rows = [getattr(sf, slot).data for sf in arr.data]
    lengths = np.fromiter((len(r) for r in rows), dtype=np.int32, count=len(rows))
    offsets = np.zeros(len(rows) + 1, dtype=np.int32)
    np.cumsum(lengths, out=offsets[1:])
    if elem in NUMPY:
        flat = [x for r in rows for x in r]
        values = pa.array(np.array(flat, dtype=NUMPY[elem]) if flat else np.zeros(0, NUMPY[elem]))
    else:
        values = pa.array([x for r in rows for x in r], pa.string())
    return pa.ListArray.from_arrays(pa.array(offsets), values)


def field_data_to_arrow(fd: Any, floats: np.ndarray | None = None) -> pa.Array:
    """One FieldData column as an Arrow array; ``valid_data`` becomes Arrow nulls. ``floats``: a float vector's values
    held outside the FieldData (a view of the payload, :mod:`~msgstream_spark.msg.vecview`), used without a copy.

    Nullable scalars come expanded (a zero value at each null row); nullable vectors of
    Milvus 3.0 / 2.6.17+ come compact (payload rows = the valid rows only): both give one
    Arrow row per ``valid_data`` entry, null where it is false.
    """
    t = int(fd.type)
    which = fd.WhichOneof("field")
    if not is_known_type(t):
        raise SchemaError(f"field {fd.field_name!r} (id {fd.field_id}) has Milvus data type {type_name(t)} ({t}), "
                          "which this version does not decode")
    if floats is not None:
        dim = int(fd.vectors.dim)
        arr = list_from_flat(floats, floats.size // dim if dim else 0, dim)
    elif t == ARRAY:
        arr = _array_to_arrow(fd)
    elif t == ARRAY_OF_VECTOR:
        arr = vector_array_to_arrow(fd.vectors.vector_array)
    elif which == "vectors" or t >= 100:
        arr = vector_to_arrow(t, fd.vectors)
    else:
        arr = _scalar_to_arrow(t, fd.scalars)
    if len(fd.valid_data):
        arr = _apply_valid(arr, np_values(fd.valid_data, np.bool_), fd.field_name)
    return arr


def field_level_validity(fd: Any) -> bool:
    """Whether the column carries validity where this version's protobufs have no field: ``ScalarField``
    #17 / ``VectorField`` #9 (Milvus proto master, "element-null"; no released server writes them)."""
    which = fd.WhichOneof("field")
    if which not in ("scalars", "vectors"):
        return False
    number = 17 if which == "scalars" else 9
    return any(f.field_number == number for f in UnknownFieldSet(getattr(fd, which)))


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


def field_data_rows(fd: Any, float_values: int | None = None) -> int:
    """Row count of a FieldData without building arrays; -1 when it cannot be read as whole rows
    (a vector whose length is not a multiple of its dimension, a dimension <= 0, an unknown type,
    ``valid_data`` matching neither all rows nor the valid ones). ``float_values``: the number of floats of a float
    vector held outside the FieldData (:mod:`~msgstream_spark.msg.vecview`)."""
    rows = _payload_rows(fd) if float_values is None else _whole(float_values, int(fd.vectors.dim))
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
    slot = SCALAR_SLOT.get(t)
    return len(getattr(fd.scalars, slot).data) if slot else -1


# -- Arrow -> FieldData ---------------------------------------------------------------------
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
    if t in NUMPY:
        zero = False if t == BOOL else 0
        target = SCALAR_ARROW[t]
        try:
            col = arr.cast(target) if arr.type != target else arr
        except pa.ArrowInvalid as exc:
            raise SchemaError(f"column {name!r}: values do not fit {type_name(t)}: {exc}") from exc
        values = col.fill_null(zero).to_numpy(zero_copy_only=False)
        if t in (FLOAT, DOUBLE):
            numpy_to_packed(getattr(fd.scalars, SCALAR_SLOT[t]), values)
        else:
            getattr(fd.scalars, SCALAR_SLOT[t]).data.extend(values.tolist())
    elif t in (STRING, VARCHAR, TEXT):
        fd.scalars.string_data.data.extend(arr.cast(pa.string()).fill_null("").to_pylist())
    elif t == TIMESTAMPTZ:
        _timestamptz_from_arrow(arr, name, fd)
    elif t == GEOMETRY:
        _geometry_from_arrow(arr, name, fd)
    elif t == ARRAY_OF_VECTOR:
        vector_array_from_arrow(arr, field_schema, fd)
    elif t == JSON:
        col = arr if pa.types.is_binary(arr.type) else arr.cast(pa.string()).cast(pa.binary())
        fd.scalars.json_data.data.extend(col.fill_null(b"").to_pylist())
    elif t == ARRAY:
        _array_from_arrow(arr, field_schema, fd)
    elif t in (FLOAT_VECTOR, FLOAT16_VECTOR, BFLOAT16_VECTOR, INT8_VECTOR):
        dense_vectors_from_arrow(arr, field_schema, fd, t)
    elif t == BINARY_VECTOR:
        binary_vectors_from_arrow(arr, field_schema, fd)
    elif t == SPARSE_VECTOR:
        sparse_from_arrow(arr, name, fd)
    else:
        raise SchemaError(f"column {name!r}: Milvus type {type_name(t)} is not supported")
    return fd


def _timestamptz_from_arrow(arr: pa.Array, name: str, fd: Any) -> None:
    """Timestamptz as Milvus stores it: int64 microseconds since the epoch (UTC; naive times are UTC)."""
    if not pa.types.is_timestamp(arr.type):
        raise SchemaError(f"column {name!r}: a Timestamptz field needs timestamp values, got {arr.type}")
    us = pc.cast(arr, pa.timestamp("us", tz=arr.type.tz), safe=False).cast(pa.int64())  # ns: truncated to us
    fd.scalars.timestamptz_data.data.extend(us.fill_null(0).to_numpy(zero_copy_only=False).tolist())


def _geometry_from_arrow(arr: pa.Array, name: str, fd: Any) -> None:
    """Geometry as Milvus stores it: WKB bytes (null rows: empty bytes)."""
    if not (pa.types.is_binary(arr.type) or pa.types.is_large_binary(arr.type)):
        raise SchemaError(f"column {name!r}: a Geometry field needs WKB binary values, got {arr.type} "
                          "(WKT text converts with e.g. shapely.wkt.loads(s).wkb)")
    fd.scalars.geometry_data.data.extend(arr.cast(pa.binary()).fill_null(b"").to_pylist())


def _array_from_arrow(arr: pa.Array, field_schema: Any, fd: Any) -> None:
    elem = int(field_schema.element_type)
    slot = SCALAR_SLOT.get(elem)
    if slot is None or elem == JSON:
        raise SchemaError(f"column {field_schema.name!r}: Array element type {type_name(elem)} is not supported")
    fd.scalars.array_data.element_type = elem
    rows = arr.to_pylist()
    out = fd.scalars.array_data.data
    for r in rows:
        sf = schema_pb2.ScalarField()
        getattr(sf, slot).data.extend(r or [])
        out.append(sf)
