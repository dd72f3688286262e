"""The source's read tasks (no Spark session) on 2.6 channels with the new types and schema changes:
an AlterCollection adding a field follows ``onSchemaChange``, a dropped field (3.0) leaves a null column."""

from __future__ import annotations

import json
import logging

import pytest

from msgstream_spark.errors import SchemaError
from msgstream_spark.spark.offsets import resolve_end, resolve_start
from msgstream_spark.spark.options import parse_read_options
from msgstream_spark.spark.reader import plan_partitions, read_partition
from msgstream_spark.spark.rows import rows_struct
from msgstream_spark.spark.schema import collection_fields
from tests.spark.helpers import spark_options
from tests.types26 import data as D
from tests.types26.test_types_decode import WAL, _without

N = len(D.ROWS)


def _read(env, ch: str, schema, **options) -> list[dict]:
    """A bounded read through planning and read tasks, with the query schema of ``schema``."""
    opts = parse_read_options({**spark_options(env), "channels": ch, **options}, streaming=False)
    fields, pk = collection_fields(schema)
    sj = json.dumps(rows_struct(fields).jsonValue())
    client = opts.client()
    try:
        start = resolve_start(client, [ch], opts.starting, opts.starting_ts, True)
        end = resolve_end(client, [ch], opts.ending, opts.ending_ts)
        parts = plan_partitions(client, start, end, opts, sj, pk)
    finally:
        client.close()
    return [r for p in parts for b in read_partition(p) for r in b.to_pylist()]


def _channel(env, alter) -> str:
    ch = env.new_channel("types-read")
    first = D.messages_26(WAL, N, D.collection_schema(), D.TT, alter=alter)
    again = D.messages_26(WAL, N, D.collection_schema(), D.TT + 10)
    D.write(env, ch, [*first[:-1], again[1], again[-1]])  # create, insert, alter, insert, tick
    return ch


def test_an_added_field_follows_on_schema_change(local_env):
    ch = _channel(local_env, D.collection_schema(with_note=True))
    with pytest.raises(SchemaError, match="adds field\\(s\\) note"):
        _read(local_env, ch, D.collection_schema())
    rows = _read(local_env, ch, D.collection_schema(), onSchemaChange="ignore")
    want = D.expected_rows()
    assert [{k: r[k] for k in want[0]} for r in rows] == want + want  # structs, times, WKB, nulls
    with_note = _read(local_env, ch, D.collection_schema(with_note=True))
    assert [r["note"] for r in with_note] == [None] * (2 * N)


def test_a_dropped_field_is_null_after_the_drop(local_env, caplog):
    ch = local_env.new_channel("types-drop")
    first = D.messages_26(WAL, N, D.collection_schema(), D.TT, alter=_without(D.collection_schema(), "title"))
    later = [f for f in WAL if f.field_name != "title"]  # inserts after the drop lack the field
    again = D.messages_26(later, N, D.collection_schema(), D.TT + 10)
    D.write(local_env, ch, [*first[:-1], again[1], again[-1]])
    with caplog.at_level(logging.WARNING):
        rows = _read(local_env, ch, D.collection_schema())  # a query begun before the drop
    assert [r["title"] for r in rows] == [r["title"] for r in D.ROWS] + [None] * N
    assert [r["clips"] for r in rows[N:]] == [r["clips"] for r in D.expected_rows()]
    assert any("drops field(s) title" in m for m in caplog.messages)


def test_an_unknown_type_fails_the_task_or_is_skipped(local_env):
    from msgstream_spark.errors import DecodeError
    from msgstream_spark.msg.pb import schema_pb2

    odd = schema_pb2.FieldData(type=29, field_name="when", field_id=120)  # Time: proto 3.0, no released writer
    odd.scalars.time_data.data.extend([1] * N)
    ch = local_env.new_channel("types-unknown")
    bad = D.messages_26([*WAL, odd], N, D.collection_schema(), D.TT)
    good = D.messages_26(WAL, N, D.collection_schema(), D.TT + 10)
    D.write(local_env, ch, [*bad[:2], good[1], good[-1]])
    with pytest.raises(DecodeError, match=f"'when' \\(id 120\\) has Milvus data type Time \\(29\\).*channel={ch}"):
        _read(local_env, ch, D.collection_schema())
    rows = _read(local_env, ch, D.collection_schema(), onDecodeError="skip")
    assert [r["id"] for r in rows] == [r["id"] for r in D.ROWS]  # the other insert, whole


def test_the_milvus_backend_reads_the_types(milvus_env):
    """The read-only ``milvus`` backend (a 2.6 proxy's DumpMessages) gives the same rows."""
    if milvus_env.extras.get("external"):
        pytest.skip("an external Milvus: the test writes through the suite's proxy store")
    ch = milvus_env.new_channel("types-milvus")
    prod = milvus_env.extras["writer"].create_producer(ch)
    try:
        for m in D.messages_26(WAL, N, D.collection_schema(), D.TT):
            prod.send(m)
    finally:
        prod.close()
    rows = _read(milvus_env, ch, D.collection_schema())
    want = D.expected_rows()
    assert [{k: r[k] for k in want[0]} for r in rows] == want
