"""A binlog payload column -> the table's column type (the types the stream and the query route give).

Payload types (storage v1, ``internal/storage/payload_writer.go`` / ``arrow_util.go`` of milvus-io/milvus):
scalars as their Arrow type, VarChar as string, JSON (and the dynamic ``$meta``) as binary holding JSON
text, an Array row as a serialized ``schema.ScalarField``, a float vector as ``FixedSizeBinary(dim * 4)``
(little-endian float32), a binary vector as ``FixedSizeBinary(dim / 8)``. Numeric and vector columns move
through their buffers; Array rows are decoded one by one (protobuf).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from msgstream_spark.errors import SchemaError
from msgstream_spark.msg.dtypes import (
    ARRAY,
    BFLOAT16_VECTOR,
    BINARY_VECTOR,
    FLOAT16_VECTOR,
    FLOAT_VECTOR,
    INT8_VECTOR,
    SCALAR_SLOT,
    SLOT_ELEMENT,
    type_name,
)
from msgstream_spark.msg.pb import schema_pb2
from msgstream_spark.msg.vectors import list_from_flat

VECTOR_DTYPE = {FLOAT_VECTOR: np.dtype("<f4"), FLOAT16_VECTOR: np.dtype("<f2"), INT8_VECTOR: np.dtype("i1")}


def _fixed_values(arr: pa.Array, dtype: np.dtype) -> tuple[np.ndarray, int]:
    """The values of a FixedSizeBinary column as one flat numpy array, and the row width in values."""
    width = arr.type.byte_width
    buf = arr.buffers()[1]
    raw = np.frombuffer(buf, dtype=np.uint8)[arr.offset * width:(arr.offset + len(arr)) * width]
    return raw.view(dtype), width // dtype.itemsize


def _vector(arr: pa.Array, t: int, target: pa.DataType) -> pa.Array:
    if t == BINARY_VECTOR:
        return arr.cast(pa.binary()).cast(target)
    if t == BFLOAT16_VECTOR:  # the high half of a float32
        raw, dim = _fixed_values(arr, np.dtype("<u2"))
        values = (raw.astype(np.uint32) << 16).view(np.float32)
    elif t in VECTOR_DTYPE:
        values, dim = _fixed_values(arr, VECTOR_DTYPE[t])
        values = values.astype(np.float32) if t == FLOAT16_VECTOR else values
    else:
        raise SchemaError(f"vector type {type_name(t)} is not read from binlogs by this version")
    return list_from_flat(np.ascontiguousarray(values), len(arr), dim).cast(target)


def _array(arr: pa.Array, target: pa.DataType) -> pa.Array:
    offsets = np.zeros(len(arr) + 1, dtype=np.int32)
    values: list = []
    for i, raw in enumerate(arr.to_pylist()):
        sf = schema_pb2.ScalarField.FromString(raw or b"")
        slot = sf.WhichOneof("data")
        row = list(getattr(sf, slot).data) if slot in SLOT_ELEMENT or slot in SCALAR_SLOT.values() else []
        values.extend(row)
        offsets[i + 1] = offsets[i] + len(row)
    elem = target.value_type if pa.types.is_list(target) or pa.types.is_large_list(target) else pa.string()
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(values, elem)).cast(target)


def to_table_column(arr: pa.Array, milvus_type: int, target: pa.DataType, name: str) -> pa.Array:
    """``arr`` (a payload column of Milvus type ``milvus_type``) as ``target``."""
    try:
        if milvus_type >= 100:
            return _vector(arr, milvus_type, target)
        if milvus_type == ARRAY:
            return _array(arr, target)
        if pa.types.is_binary(arr.type) and (pa.types.is_string(target) or pa.types.is_large_string(target)):
            return arr.cast(pa.string()).cast(target)
        return arr.cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError) as exc:
        raise SchemaError(f"field {name!r} ({type_name(milvus_type)}): its binlog column of type {arr.type} does not "
                          f"convert to the table's {target}: {exc}") from exc
