"""Milvus 2.6 / 3.0 field types through ``spark.read.format("msgstream")`` and the sink, end to end.

The channels hold what Milvus writes (tests/types26/data.py: pymilvus's encoder, the proxy's
conversions, independent envelopes, the schema in CreateCollection); the rows must be the
values the user inserted. Then the same collection goes through the sink and back on every backend.
"""

from __future__ import annotations

import pytest

from tests.spark.helpers import spark_options
from tests.types26 import data as D

pytestmark = pytest.mark.slow  # Spark end to end
N = len(D.ROWS)
COMPARED = ("id", "vec", "title", "shape", "i8v", "clips", "marks")
FIELD_TYPES = "title:Text,shape:Geometry,i8v:Int8Vector"


def _read(spark, env, ch, **opts):
    r = spark.read.format("msgstream").options(**spark_options(env)).option("channels", ch)
    return r.options(**{k: str(v) for k, v in opts.items()}).load()


def _values(df, extra=()) -> list[dict]:
    """Rows (sorted by id) with the timestamp as exact microseconds since the epoch."""
    cols = [c for c in (*COMPARED, *extra) if c in df.columns]
    rows = df.where("op = 'insert'").selectExpr(*cols, "unix_micros(at) AS at_us").orderBy("id").collect()
    return [r.asDict(recursive=True) for r in rows]


def _expected(extra=()) -> list[dict]:
    out = []
    for r, raw in zip(D.expected_rows(), D.ROWS):
        e = {k: r[k] for k in (*COMPARED, *extra)}
        e["shape"] = None if e["shape"] is None else bytearray(e["shape"])
        e["marks"] = [{**m, "bits": bytearray(m["bits"])} for m in e["marks"]]
        e["at_us"] = None if raw["at"] is None else D.parse_time_tz(raw["at"])
        out.append(e)
    return out


@pytest.mark.parametrize("fmt", ["2.5", "2.6"])
def test_rows_equal_what_was_inserted(spark, local_env, fmt):
    ch = local_env.new_channel(f"types{fmt}")
    fields = D.to_wal_form(D.client_request(), D.collection_schema())
    schema = D.collection_schema()
    if fmt == "2.5":
        D.write(local_env, ch, D.messages_25(fields, N, schema, D.TT))
    else:  # with an AlterCollection adding a field (the full new schema), as 2.6.6+ broadcasts it
        D.write(local_env, ch, D.messages_26(fields, N, schema, D.TT, alter=D.collection_schema(with_note=True)))
    df = _read(spark, local_env, ch)
    types = {f.name: f.dataType.simpleString() for f in df.schema.fields}
    assert types["at"] == "timestamp" and types["shape"] == "binary"
    assert types["clips"] == "array<struct<frame_ids:bigint,emb:array<float>>>"
    assert ("note" in types) == (fmt == "2.6")  # the altered schema wins inference
    assert _values(df, ("nvec",)) == _expected(("nvec",))  # compact nullable vectors: None where null
    assert [r.sparse for r in df.select("sparse").collect()] == [None] * N  # BM25 output: computed after the WAL


@pytest.mark.parametrize("backend", ["local", "kafka", "pulsar"], indirect=True)
def test_the_same_collection_through_the_sink_and_back(spark, local_env, backend):
    src = local_env.new_channel("types-src")
    D.write(local_env, src, D.messages_26(D.to_wal_form(D.client_request(), D.collection_schema()), N,
                                          D.collection_schema(), D.TT))
    df = _read(spark, local_env, src).select(*COMPARED, "at")
    for fmt in ("2.5", "2.6"):
        out = backend.new_channel(f"types-out{fmt}")
        (df.write.format("msgstream").options(**spark_options(backend)).option("channels", out)
         .option("primaryKey", "id").option("fieldTypes", FIELD_TYPES).option("wireFormat", fmt)
         .mode("append").save())
        back = _read(spark, backend, out)  # schema inferred from the inserts: structs from their column names
        types = {f.name: f.dataType.simpleString() for f in back.schema.fields}
        assert types["marks"] == "array<struct<label:string,bits:binary,q:array<tinyint>>>", fmt
        assert _values(back) == _expected(), fmt
