"""A user's ``schema`` option (Spark DDL such as ``pk bigint, vec array<float>``) as Arrow, without Spark.

Only the types a Milvus collection maps to are known (docs/spark-source.md, "Types"); anything else
is an :class:`~msgstream_spark.errors.OptionError` naming the column. Spark reads the same DDL itself.
"""

from __future__ import annotations

import re

import pyarrow as pa

from msgstream_spark.errors import OptionError
from msgstream_spark.source.rows import _ddl_columns

_SIMPLE = {
    "boolean": pa.bool_(), "tinyint": pa.int8(), "byte": pa.int8(), "smallint": pa.int16(), "short": pa.int16(),
    "int": pa.int32(), "integer": pa.int32(), "bigint": pa.int64(), "long": pa.int64(), "float": pa.float32(),
    "real": pa.float32(), "double": pa.float64(), "string": pa.string(), "binary": pa.binary(),
    "timestamp": pa.timestamp("us", tz="UTC"),
}


_DECIMAL = re.compile(r"decimal\((\d+),(\d+)\)")


def arrow_type(text: str, column: str, element: bool = False) -> pa.DataType:
    """The Arrow type of a DDL type (``element``: an array's element, where ``struct<...>`` may stand)."""
    t = text.strip()
    low = t.lower().replace(" ", "")
    if low in _SIMPLE:
        return _SIMPLE[low]
    if low.startswith(("varchar(", "char(")):
        return pa.string()
    m = _DECIMAL.fullmatch(low)
    if m and int(m.group(1)) <= 38:  # _seq is decimal(38,0)
        return pa.decimal128(int(m.group(1)), int(m.group(2)))
    if low.startswith("array<") and low.endswith(">"):
        return pa.list_(arrow_type(t[t.index("<") + 1:-1], column, element=True))
    if element and low.startswith("struct<") and low.endswith(">"):  # a struct array: array<struct<a:bigint,...>>
        return pa.struct([_struct_field(part, column) for part in _ddl_columns(t[t.index("<") + 1:-1])])
    if low.startswith("map<") and low.endswith(">"):
        parts = _ddl_columns(t[t.index("<") + 1:-1])
        if len(parts) == 2:
            return pa.map_(arrow_type(parts[0], column), arrow_type(parts[1], column))
    raise OptionError(f"option schema: column {column}: type {text.strip()!r} is not one this source reads "
                      f"(known: {', '.join(sorted(_SIMPLE))}, decimal(p,s), array<...>, array<struct<...>>, "
                      "map<...,...>)")


def _struct_field(part: str, column: str) -> pa.Field:
    """``name:type`` (or ``name type``) inside ``struct<...>``."""
    name, sep, typ = part.partition(":")
    if not sep or "<" in name:
        name, _, typ = part.strip().partition(" ")
    if not name.strip() or not typ.strip():
        raise OptionError(f"option schema: column {column}: struct field {part.strip()!r} is not 'name:type'")
    return pa.field(name.strip().strip("`"), arrow_type(typ, column), nullable=True)


def ddl_arrow_schema(ddl: str) -> pa.Schema:
    """The Arrow schema of a DDL column list (every column nullable, as Spark reads it)."""
    fields = []
    for col in _ddl_columns(ddl):
        parts = col.split(None, 1)
        if len(parts) != 2:
            raise OptionError(f"option schema: {col!r} is not 'name type'")
        name = parts[0].strip("`")
        typ = parts[1].split(" NOT NULL")[0].split(" not null")[0]
        fields.append(pa.field(name, arrow_type(typ, name), nullable=True))
    return pa.schema(fields)
