"""The source's read tasks (no Spark session) on 2.6 channels with the new types and schema changes:
an AlterCollection adding a field follows ``onSchemaChange``, a dropped field (3.0) leaves a null column."""

from __future__ import annotations

import logging

import pyarrow as pa
import pytest

from msgstream_spark.errors import SchemaError
from msgstream_spark.msg.schema import collection_arrow_schema
from msgstream_spark.source import read_table
from msgstream_spark.source.arrow import read_options, schema_json
from msgstream_spark.source.offsets import resolve_end, resolve_start
from msgstream_spark.source.read import collection_filter, plan_reads, read_range
from msgstream_spark.source.rows import rows_arrow_schema
from tests.types26 import data as D
from tests.types26.test_types_decode import WAL, _without

N = len(D.ROWS)


def _read(env, ch: str, coll, **options) -> list[dict]:
    """A bounded read through the read core's planning and per-range read, with the query schema of
    the collection schema ``coll`` (as a query that inferred it before later schema changes)."""
    opts = read_options(env.config, ch, **options)
    schema = rows_arrow_schema(collection_arrow_schema(coll))
    client = opts.client()
    try:
        start = resolve_start(client, [ch], opts.starting, opts.starting_ts, opts.fail_on_data_loss,
                              opts.subscription)
        end = resolve_end(client, [ch], opts.ending, opts.ending_ts)
        ranges = plan_reads(client, start, end, opts, schema_json(schema, None), "id", collection_filter(opts))
    finally:
        client.close()
    return [r for rg in ranges for b in read_range(rg, schema) for r in b.to_pylist()]


@pytest.mark.parametrize("fmt", ["2.5", "2.6"])
def test_the_library_reads_what_was_inserted(local_env, fmt):
    """``msgstream_spark.source.read_table``: the schema inferred from the channel's CreateCollection."""
    ch = local_env.new_channel(f"types-lib{fmt}")
    schema = D.collection_schema()
    make = D.messages_25 if fmt == "2.5" else D.messages_26
    D.write(local_env, ch, make(WAL, N, schema, D.TT))
    table = read_table(local_env.config, ch)
    assert table.schema.field("at").type == pa.timestamp("us", tz="UTC")
    want = D.expected_rows()
    assert [{k: r[k] for k in want[0]} for r in table.to_pylist()] == want
    ddl = "id bigint, at timestamp, clips array<struct<frame_ids:bigint,emb:array<float>>>"  # a user's schema
    given = read_table(local_env.config, ch, schema=ddl).select(["id", "at", "clips"]).to_pylist()
    assert given == [{k: r[k] for k in ("id", "at", "clips")} for r in want]


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


def test_msgstream_rows_prints_them(local_env, tmp_path, capsys):
    """The CLI's ``msgstream rows`` (the library's read as JSON lines): times ISO-8601 UTC, binary base64."""
    import base64
    import json

    from msgstream_spark.cli.main import main
    from tests.sink.helpers import config_file

    ch = local_env.new_channel("types-cli-rows")
    D.write(local_env, ch, D.messages_26(WAL, N, D.collection_schema(), D.TT))
    assert main(["rows", "--config", config_file(local_env, tmp_path), "-c", ch]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines() if line.strip()]
    want = D.expected_rows()
    assert [r["at"] for r in rows] == [None if w["at"] is None else w["at"].isoformat() for w in want]
    assert [r["shape"] for r in rows] == [None if w["shape"] is None else base64.b64encode(w["shape"]).decode()
                                          for w in want]
    assert rows[1]["marks"] == [{"label": "b", "bits": "/wA=", "q": [-128, 0, 127]},
                                {"label": "c", "bits": "D/A=", "q": [4, 5, 6]}]
    assert [r["nvec"] for r in rows] == [w["nvec"] for w in want] and rows[0]["clips"] == want[0]["clips"]
