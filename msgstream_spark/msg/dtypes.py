"""Milvus ``schema.DataType`` numbers, their ScalarField slots and their Arrow types.

The Arrow / Spark type of every Milvus type is the table in docs/spark-source.md (Types).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

from msgstream_spark.errors import SchemaError
from msgstream_spark.msg.pb import schema_pb2

# DataType numbers (schema.proto)
BOOL, INT8, INT16, INT32, INT64, FLOAT, DOUBLE = 1, 2, 3, 4, 5, 10, 11
STRING, VARCHAR, ARRAY, JSON = 20, 21, 22, 23
GEOMETRY, TEXT, TIMESTAMPTZ = 24, 25, 26  # Milvus 2.6 / 3.0 (docs/spark-source.md, type table)
BINARY_VECTOR, FLOAT_VECTOR, FLOAT16_VECTOR, BFLOAT16_VECTOR, SPARSE_VECTOR, INT8_VECTOR = 100, 101, 102, 103, 104, 105
ARRAY_OF_VECTOR, ARRAY_OF_STRUCT = 106, 200
DENSE_VECTORS = (FLOAT_VECTOR, FLOAT16_VECTOR, BFLOAT16_VECTOR, INT8_VECTOR, BINARY_VECTOR)
TIMESTAMP_US_UTC = pa.timestamp("us", tz="UTC")

SCALAR_ARROW = {BOOL: pa.bool_(), INT8: pa.int8(), INT16: pa.int16(), INT32: pa.int32(), INT64: pa.int64(),
                 FLOAT: pa.float32(), DOUBLE: pa.float64(), STRING: pa.string(), VARCHAR: pa.string(),
                 JSON: pa.string(), TEXT: pa.string(), GEOMETRY: pa.binary(), TIMESTAMPTZ: TIMESTAMP_US_UTC}
NUMPY = {BOOL: np.bool_, INT8: np.int8, INT16: np.int16, INT32: np.int32, INT64: np.int64,
          FLOAT: np.float32, DOUBLE: np.float64}
# ScalarField oneof member per data type
SCALAR_SLOT = {BOOL: "bool_data", INT8: "int_data", INT16: "int_data", INT32: "int_data", INT64: "long_data",
                FLOAT: "float_data", DOUBLE: "double_data", STRING: "string_data", VARCHAR: "string_data",
                JSON: "json_data", TEXT: "string_data", GEOMETRY: "geometry_data", TIMESTAMPTZ: "timestamptz_data"}
# Array elements Milvus accepts (proxy util.go validateElementType)
ARRAY_ELEMENTS = (BOOL, INT8, INT16, INT32, INT64, FLOAT, DOUBLE, STRING, VARCHAR)


# The element type an Array row's populated ScalarField slot implies (Int8/Int16 also use int_data).
SLOT_ELEMENT = {"bool_data": BOOL, "int_data": INT32, "long_data": INT64, "float_data": FLOAT,
                 "double_data": DOUBLE, "string_data": VARCHAR}


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
    if t in SCALAR_ARROW:
        return SCALAR_ARROW[t]
    if t == ARRAY:
        if elem not in ARRAY_ELEMENTS:
            raise SchemaError(f"Array element type {type_name(elem)} is not supported{where}")
        return pa.list_(SCALAR_ARROW[elem])
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
    return t in SCALAR_ARROW or t in (ARRAY, SPARSE_VECTOR, ARRAY_OF_VECTOR) or t in DENSE_VECTORS
