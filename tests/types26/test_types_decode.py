"""Milvus 2.6 / 3.0 field types through the library, without Spark (data: tests/types26/data.py).

pymilvus's own encoder gives the client form, the test applies the proxy's conversions, and the
2.5 / 2.6 envelopes come from protobufs and the independent WAL producer; the library must give
back the values the user inserted.
"""

from __future__ import annotations

import datetime as dt
import json

import numpy as np
import pyarrow as pa
import pytest
import shapely

from msgstream_spark.errors import DecodeError, SchemaError
from msgstream_spark.msg import codec
from msgstream_spark.msg.columns import arrow_to_field_data, field_data_to_arrow
from msgstream_spark.msg.pb import schema_pb2
from msgstream_spark.msg.schema import collection_arrow_schema, infer_collection_schema
from msgstream_spark.msg.structs import flatten_struct_column, struct_schema_from_arrow
from msgstream_spark.msg.wal26 import decode_message
from tests.types26 import data as D

N = len(D.ROWS)
WAL = D.to_wal_form(D.client_request(), D.collection_schema())


def _decoded(fmt: str, fields=WAL, schema=None):
    schema = schema or D.collection_schema()
    msgs = D.messages_25(fields, N, schema, D.TT) if fmt == "2.5" else D.messages_26(fields, N, schema, D.TT)
    create, insert = (decode_message(m.payload, m.properties, channel="ch", msg_id=b"m") for m in msgs[:2])
    return create, insert


def test_the_wal_form_is_the_documented_one():
    """The transformer's output for the doc's example shape (§6): flattened ``struct[sub]`` columns with
    the sub-fields' ids and element types, WKB in geometry_data, microseconds in timestamptz_data."""
    by_name = {f.field_name: f for f in WAL}
    assert [f.field_name for f in WAL][-5:] == ["clips[frame_ids]", "clips[emb]", "marks[label]", "marks[bits]",
                                                "marks[q]"]
    emb = by_name["clips[emb]"]
    assert (emb.type, emb.field_id, emb.vectors.vector_array.element_type) == (106, 110, 101)
    assert list(emb.vectors.vector_array.data[0].float_vector.data) == pytest.approx([0.1, 0.2, 0.3, 0.4])
    assert by_name["clips[frame_ids]"].scalars.array_data.element_type == schema_pb2.DataType.Int64
    shape = by_name["shape"]
    assert shape.scalars.WhichOneof("data") == "geometry_data" and shape.scalars.geometry_data.data[2] == b""
    assert shape.scalars.geometry_data.data[0] == bytes.fromhex("0101000000000000000000f03f0000000000000040")
    at = by_name["at"]
    assert at.scalars.timestamptz_data.data[0] == 1_743_294_600_000_000  # 2025-03-30T00:30:00Z
    assert list(at.valid_data) == [True, True, True, False, True]
    assert len(by_name["nvec"].vectors.float_vector.data) == 3 * 2  # compact: the 3 valid rows only


@pytest.mark.parametrize("fmt", ["2.5", "2.6"])
def test_every_type_reads_back_as_inserted(fmt):
    create, insert = _decoded(fmt)
    batch = insert.to_arrow(create.schema)
    assert batch.schema.field("at").type == pa.timestamp("us", tz="UTC")
    assert batch.schema.field("shape").type == pa.binary()
    assert batch.schema.field("clips").type == pa.list_(pa.struct([("frame_ids", pa.int64()),
                                                                   ("emb", pa.list_(pa.float32()))]))
    got = batch.to_pylist()
    want = D.expected_rows()
    assert got == want
    # geometries byte for byte, and as WKT through an independent converter
    for g, w in zip(got, D.WKT):
        assert g["shape"] is None if w is None else shapely.from_wkb(g["shape"]).equals(shapely.from_wkt(w))
    # timestamps: the absolute instants, whatever zone and DST side the input was written in
    assert got[0]["at"] == dt.datetime(2025, 3, 30, 0, 30, tzinfo=dt.timezone.utc)
    assert got[1]["at"] == dt.datetime(2024, 11, 3, 6, 30, tzinfo=dt.timezone.utc)
    assert got[4]["at"] == dt.datetime(2025, 5, 1, 15, 59, 59, 123456, tzinfo=dt.timezone.utc)
    # vector arrays bit for bit
    emb = batch.column("clips").flatten().field("emb").flatten().to_numpy()
    want_emb = np.array([x for r in D.ROWS for c in r["clips"] for x in c["emb"]], np.float32)
    assert emb.view(np.uint32).tolist() == want_emb.view(np.uint32).tolist()
    assert [r["nvec"] for r in got] == [[0.5, 0.25], None, None, [1.5, -2.0], [0.0, 1.0]]  # compact nulls


def test_collection_schema_travels_in_field_13_or_as_bytes():
    create13, _ = _decoded("2.6")
    assert create13.proto.schema == b"" and create13.proto.HasField("collection_schema")
    create8, _ = _decoded("2.5")
    assert create8.schema == create13.schema
    names = collection_arrow_schema(create13.schema).names
    assert names == ["id", "vec", "title", "shape", "at", "i8v", "nvec", "sparse", "clips", "marks"]


def test_raw_sub_field_names_of_early_26():
    """2.6.0-2.6.3 kept raw sub-field names: with the schema the structs are rebuilt the same."""
    schema = D.collection_schema(stored_names=False)
    fields = D.to_wal_form(D.client_request(), schema, stored_names=False)
    create, insert = _decoded("2.6", fields, schema)
    assert insert.to_arrow(create.schema).to_pylist() == D.expected_rows()
    assert "frame_ids" in insert.to_arrow().schema.names  # without a schema: the flattened columns


@pytest.mark.parametrize("compact", [False, True])
def test_a_null_row_of_a_nullable_struct_is_null(compact):
    """3.0 nullable structs: the proxy expands the null rows (empty rows + valid_data); compact input reads too."""
    schema = D.collection_schema(nullable_marks=True)
    rows = [dict(r) for r in D.ROWS]
    rows[2]["marks"] = None
    fields = D.to_wal_form(D.client_request(rows, D.collection_schema(nullable_marks=True, system_fields=False)),
                           schema, compact_structs=compact)
    q = next(f for f in fields if f.field_name == "marks[q]")
    assert len(q.vectors.vector_array.data) == (4 if compact else 5) and list(q.valid_data)[2] is False
    create, insert = _decoded("2.6", fields, schema)
    got = insert.to_arrow(create.schema).to_pylist()
    assert got == D.expected_rows(rows) and got[2]["marks"] is None and got[3]["marks"] == []


def test_inference_from_an_insert_rebuilds_structs_from_their_names():
    _, insert = _decoded("2.6")
    inferred = infer_collection_schema(insert.proto)
    assert [s.name for s in inferred.struct_array_fields] == ["clips", "marks"]
    arrow = collection_arrow_schema(inferred)
    assert "clips[emb]" not in arrow.names and "sparse" not in arrow.names  # BM25 output: not in the WAL
    got = insert.to_arrow(inferred).to_pylist()
    for g, w in zip(got, D.expected_rows()):
        w.pop("sparse")
        assert g == w


def test_spark_types():
    from msgstream_spark.spark.structs import collection_fields

    fields, pk = collection_fields(D.collection_schema())
    types = {f.name: f.dataType.simpleString() for f in fields}
    assert pk == "id"
    assert types["at"] == "timestamp" and types["shape"] == "binary" and types["title"] == "string"
    assert types["clips"] == "array<struct<frame_ids:bigint,emb:array<float>>>"
    assert types["marks"] == "array<struct<label:string,bits:binary,q:array<tinyint>>>"
    assert types["sparse"] == "map<bigint,float>"


def test_cli_rows_show_the_values(local_env, tmp_path, capsys):
    """``msgstream tail --rows`` on a 2.6 channel: structs whole, UTC times, Geometry as WKT, nulls."""
    from msgstream_spark.cli.main import main
    from tests.sink.helpers import config_file

    ch = local_env.new_channel("types-cli")
    D.write(local_env, ch, D.messages_26(WAL, N, D.collection_schema(), D.TT))
    code = main(["tail", "--config", config_file(local_env, tmp_path), "-c", ch, "--limit", "2", "--rows"])
    out, err = capsys.readouterr()
    assert code == 0, err
    rows = [json.loads(line) for line in out.splitlines() if line.strip()][1]["rows"]
    assert rows[0]["at"] == "2025-03-30T00:30:00+00:00"
    assert rows[1]["clips"] == [{"frame_ids": 9, "emb": pytest.approx([0.5, 0.6])}]
    assert rows[2]["nvec"] is None and rows[2]["shape"] is None
    assert [r["shape"] for r in rows] == [None if w is None else shapely.to_wkt(shapely.from_wkt(w), trim=True)
                                          for w in D.WKT]  # Geometry as WKT
    assert "clips[emb]" not in rows[0] and rows[1]["marks"][0]["bits"] == "/wA="  # binary: base64


@pytest.mark.parametrize("t, name", [(27, "Mol"), (28, "Date"), (30, "Decimal"), (31, "31")])
def test_a_type_this_version_does_not_know_is_a_clear_error(t, name):
    odd = schema_pb2.FieldData(type=t, field_name="future", field_id=120)
    odd.scalars.bytes_data.data.extend([b"x"] * N)
    msgs = D.messages_26([*WAL, odd], N, D.collection_schema(), D.TT)
    with pytest.raises(DecodeError) as err:
        decode_message(msgs[1].payload, msgs[1].properties, channel="by-dev-dml_0", msg_id=b"\x01\x02")
    text = str(err.value)
    assert f"{name} ({t})" in text and "'future'" in text and "by-dev-dml_0" in text and "msgID(base64)=AQI=" in text
    with pytest.raises(SchemaError, match=f"{name} \\({t}\\).*'future'"):
        collection_arrow_schema(schema_pb2.CollectionSchema(fields=[schema_pb2.FieldSchema(
            fieldID=120, name="future", data_type=t)]))


def test_inconsistent_compact_nulls_are_a_decode_error():
    bad = schema_pb2.FieldData()
    bad.CopyFrom(next(f for f in WAL if f.field_name == "nvec"))
    bad.valid_data[0] = False  # 2 valid rows claimed, 3 vectors sent
    fields = [bad if f.field_name == "nvec" else f for f in WAL]
    msgs = D.messages_25(fields, N, D.collection_schema(), D.TT)
    with pytest.raises(DecodeError, match="'nvec'"):
        codec.unmarshal(msgs[1].payload, msgs[1].properties, channel="c")


def test_the_sink_encoders_write_the_wal_form():
    """Arrow values -> FieldData equal, field by field, to the proxy's form built from pymilvus's output."""
    schema = D.collection_schema()
    fs = {f.name: f for f in schema.fields}
    by_name = {f.field_name: f for f in WAL}
    _, insert = _decoded("2.6")
    batch = insert.to_arrow(schema)
    for name in ("title", "shape", "at", "i8v"):
        mine = arrow_to_field_data(batch.column(name), fs[name])
        assert mine == by_name[name], name
    for ss in schema.struct_array_fields:
        for mine in flatten_struct_column(batch.column(ss.name), ss):
            assert mine == by_name[mine.field_name], mine.field_name
    # the sink's own struct schema from the Arrow type names and types the sub-fields as Milvus does
    own = struct_schema_from_arrow("marks", batch.schema.field("marks").type, field_id=111, sub_ids=[112, 113, 114])
    assert [(f.name, f.data_type, f.element_type) for f in own.fields] == [
        ("marks[label]", 22, 21), ("marks[bits]", 106, 100), ("marks[q]", 106, 105)]


def test_timestamps_keep_microseconds_across_zones():
    col = pa.array([dt.datetime(2024, 3, 10, 2, 30, 0, 1)], pa.timestamp("us", tz="America/New_York"))
    fd = arrow_to_field_data(col, schema_pb2.FieldSchema(name="t", data_type=26, fieldID=100))
    back = field_data_to_arrow(fd)
    assert back.type == pa.timestamp("us", tz="UTC") and back.cast(pa.int64()).to_pylist() == \
        col.cast(pa.int64()).to_pylist()


def _without(schema, name: str):
    """The schema after a 3.0 drop-field AlterCollection: the field gone (its id in ``dropped_field_ids``)."""
    out = schema_pb2.CollectionSchema()
    out.CopyFrom(schema)
    keep = [f for f in out.fields if f.name != name]
    del out.fields[:]
    out.fields.extend(keep)
    return out


@pytest.mark.parametrize("schema_change", [False, True])
def test_inference_follows_added_and_dropped_fields(local_env, schema_change):
    from msgstream_spark.source.options import parse_read_options
    from msgstream_spark.spark.structs import infer
    from tests.spark.helpers import spark_options

    ch = local_env.new_channel("types-infer")
    added = D.collection_schema(with_note=True)
    msgs = D.messages_26(WAL, N, D.collection_schema(), D.TT, alter=added, schema_change=schema_change,
                         schema_bytes=schema_change)  # 2.6.0: SchemaChange, the schema as bytes in #8
    dropped = D.messages_26(WAL, N, D.collection_schema(), D.TT + 10, alter=_without(added, "title"))[2]
    D.write(local_env, ch, [*msgs, dropped])  # 3.0's drop: an AlterCollection without the field
    opts = parse_read_options({**spark_options(local_env), "channels": ch}, streaming=False)
    struct, pk, cid = infer(opts, [ch])
    types = {f.name: f.dataType.simpleString() for f in struct.fields}
    assert (pk, cid) == ("id", D.COLLECTION)
    assert types["note"] == "string" and "title" not in types  # the newest AlterCollection's schema wins
    assert types["marks"] == "array<struct<label:string,bits:binary,q:array<tinyint>>>"
    assert types["at"] == "timestamp"


def test_skip_drops_only_the_message_with_an_unknown_type_and_counts_it(local_env):
    from msgstream_spark.msg.types import InsertMsg
    from msgstream_spark.stream import Factory

    odd = schema_pb2.FieldData(type=27, field_name="mol", field_id=120)
    odd.scalars.mol_data.data.extend([b"pickle"] * N)  # Mol: proto 3.0, written by no released Milvus
    ch = local_env.new_channel("types-skip")
    bad = D.messages_26([*WAL, odd], N, D.collection_schema(), D.TT)
    good = D.messages_26(WAL, N, D.collection_schema(), D.TT + 10)
    D.write(local_env, ch, [bad[1], good[1]])
    with Factory(local_env.config).msgstream(on_decode_error="skip") as s:
        s.as_consumer([ch], "types-skip", "earliest")
        packs = [s.consume(timeout=2) for _ in range(2)]
        assert packs[1] is None  # one message left after the skip
        assert len(s.skipped) == 1 and "Mol (27)" in s.skipped[0].reason and "'mol'" in s.skipped[0].reason
    inserts = [m for m in packs[0].msgs if isinstance(m, InsertMsg)]
    assert [m.num_rows for m in inserts] == [N]


def test_the_sinks_insert_carries_the_proxys_wal_form(local_env, tmp_path):
    """The sink's whole InsertRequest (wireFormat 2.6) holds, column by column, what the proxy writes."""
    from msgstream_spark.msg.pb import msg_pb2
    from msgstream_spark.sink.options import parse_sink_options
    from msgstream_spark.sink.plan import plan_write
    from msgstream_spark.sink.task import TaskWriter
    from tests.sink.helpers import config_file

    create, insert = _decoded("2.6")
    batch = insert.to_arrow(create.schema).drop_columns(["nvec", "sparse"])  # the sink writes no null vectors
    opts = parse_sink_options({"config": config_file(local_env, tmp_path), "channels": "types-sink",
                               "primaryKey": "id", "wireFormat": "2.6",
                               "fieldTypes": "title:Text,shape:Geometry,i8v:Int8Vector"})
    [msg] = TaskWriter(opts, plan_write(batch.schema, opts)).encoder.encode(batch)
    req = msg_pb2.InsertRequest()
    req.ParseFromString(msg.payload)
    mine = {f.field_name: f for f in req.fields_data}
    assert list(mine) == [f.field_name for f in WAL if f.field_name != "nvec"]
    for want in WAL:
        if want.field_name == "nvec":
            continue
        got = schema_pb2.FieldData()
        got.CopyFrom(mine[want.field_name])
        got.field_id = want.field_id  # the sink numbers its own fields
        assert got == want, want.field_name


def test_validity_in_fields_this_version_cannot_read_is_an_error_not_a_misread():
    """Milvus proto master moves validity into ScalarField.valid_data (#17): without FieldData.valid_data
    beside it, the nulls would be lost, so the decode fails naming the field."""
    from msgstream_spark.msg.wire import encode_varint

    fields = []
    for f in WAL:
        g = schema_pb2.FieldData()
        g.CopyFrom(f)
        if f.field_name == "title":
            del g.valid_data[:]
            g.scalars.MergeFromString(encode_varint(17 << 3 | 2) + encode_varint(N) + bytes(f.valid_data))
        fields.append(g)
    msgs = D.messages_25(fields, N, D.collection_schema(), D.TT)
    with pytest.raises(DecodeError, match="'title' \\(id 102\\) carries its validity"):
        codec.unmarshal(msgs[1].payload, msgs[1].properties, channel="c")


@pytest.mark.parametrize("name", ["Mol", "Date", "Decimal", "ArrayOfVector", "ArrayOfStruct"])
def test_the_sink_refuses_types_no_released_milvus_writes_at_plan_time(name):
    from msgstream_spark.msg.schema import field_schema_from_arrow

    with pytest.raises(SchemaError, match=f"column 'x': Milvus type {name} \\(\\d+\\) cannot be written"):
        field_schema_from_arrow("x", pa.binary(), field_id=101, milvus_type=name)
