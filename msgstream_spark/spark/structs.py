"""The source's schema as Spark types: the core's fixed columns and inferred collection as a StructType."""

from __future__ import annotations

from typing import Any

from pyspark.sql import types as T

from msgstream_spark.msg.schema import collection_arrow_schema
from msgstream_spark.msg.seq import SEQ_DDL
from msgstream_spark.source.multi import COLLECTIONS_DDL
from msgstream_spark.source.options import ReadOptions
from msgstream_spark.source.rows import MESSAGES_DDL, METADATA_DDL, OP, ddl_fields
from msgstream_spark.source.schema import infer_collection, primary_key


def _spark_fields(ddl_like: str) -> list:
    """StructFields from our fixed 'name type, ...' lists without a SparkContext."""
    simple = {"string": T.StringType(), "bigint": T.LongType(), "int": T.IntegerType(), "timestamp": T.TimestampType(),
              "binary": T.BinaryType(), "map<string,string>": T.MapType(T.StringType(), T.StringType()),
              SEQ_DDL: T.DecimalType(38, 0)}
    return [T.StructField(name, simple[typ], True) for name, typ in ddl_fields(ddl_like)]


def rows_struct(collection_fields: list) -> T.StructType:
    """op + the collection's fields + metadata columns, as a StructType."""
    return T.StructType([T.StructField(OP, T.StringType(), True), *collection_fields, *_spark_fields(METADATA_DDL)])


def messages_struct() -> T.StructType:
    return T.StructType(_spark_fields(MESSAGES_DDL))


def collection_fields(coll_schema: Any) -> tuple[list, str | None]:
    """(StructFields of the collection's user fields, primary key name)."""
    from pyspark.sql.pandas.types import from_arrow_type

    arrow = collection_arrow_schema(coll_schema)
    return [T.StructField(f.name, from_arrow_type(f.type), True) for f in arrow], primary_key(coll_schema)


def infer(opts: ReadOptions, channels: list[str]) -> tuple[Any, str | None, int | None]:
    """(StructType, pk name, collection id) for ``opts``; SchemaError if nothing is found."""
    if opts.output == "messages":
        return messages_struct(), None, None
    if opts.output == "collections":
        return T.StructType(_spark_fields(COLLECTIONS_DDL)), None, None
    coll, cid = infer_collection(opts, channels)
    fields, pk = collection_fields(coll)
    return rows_struct(fields), pk, cid
