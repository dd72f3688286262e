"""Every type the stream reads comes out of the snapshot with the same Arrow type and the same bytes.

The suite's proxy answers ``Query`` as Milvus does for 2.6 / 3.0 types (Timestamptz as ISO text,
Geometry as WKT, vectors and JSON as their stored bytes); the stream's side is an InsertRequest in the
log's form (the proxy's conversions applied here: WKB from shapely, microseconds since the epoch),
decoded by the stream's own code. The snapshot's columns must equal the stream's, value for value.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from msgstream_spark.mirror.common import table_schema
from msgstream_spark.mirror.snapshot.query.ranges import PkRange
from msgstream_spark.mirror.snapshot.query.reader import RangeReader
from msgstream_spark.mirror.snapshot.query.rpc import QueryTarget
from msgstream_spark.mq.milvus.settings import MilvusSettings
from msgstream_spark.msg.pb import schema_pb2
from msgstream_spark.msg.schema import collection_arrow_schema
from msgstream_spark.msg.types import InsertMsg
from tests.fixtures.milvus_env import milvus_config

shapely = pytest.importorskip("shapely")

DT = schema_pb2.DataType
NAME, CID = "types", 9001
N = 6


def _schema() -> schema_pb2.CollectionSchema:
    s = schema_pb2.CollectionSchema(name=NAME, enable_dynamic_field=True)
    s.fields.add(fieldID=100, name="pk", is_primary_key=True, data_type=DT.Int64)
    for fid, name, t, dim in ((101, "f16", DT.Float16Vector, 4), (102, "bf16", DT.BFloat16Vector, 4),
                              (103, "i8", DT.Int8Vector, 4), (104, "bv", DT.BinaryVector, 16),
                              (105, "fv", DT.FloatVector, 3)):
        s.fields.add(fieldID=fid, name=name, data_type=t).type_params.add(key="dim", value=str(dim))
    s.fields.add(fieldID=106, name="tz", data_type=DT.Timestamptz, nullable=True)
    s.fields.add(fieldID=107, name="geo", data_type=DT.Geometry, nullable=True)
    s.fields.add(fieldID=108, name="j", data_type=DT.JSON)
    s.fields.add(fieldID=109, name="arr", data_type=DT.Array, element_type=DT.Int64).type_params.add(
        key="max_capacity", value="8")
    s.fields.add(fieldID=110, name="txt", data_type=DT.Text)
    s.fields.add(fieldID=111, name="$meta", data_type=DT.JSON, is_dynamic=True)
    return s


def _rows() -> list[dict]:
    rng = np.random.default_rng(5)
    shapes = ["POINT (1 2)", "LINESTRING (0 0, 1.5 2.25)", "POLYGON ((0 0, 1 0, 1 1, 0 0))", "POINT Z (1 2 3)",
              "MULTIPOINT ((1 2), (3 4))", None]
    jsons = [b'"a string"', b'{"b": 1,  "a":[1, 2.50]}', b"12", b"null", b'{"\\u00e9":"\xc3\xa9"}', b"[]"]
    times = [0, 1_700_000_000_123_456, -1_000_001, 1_700_000_000_000_000, None, 253_402_300_799_999_999]
    out = []
    for i in range(N):
        f = rng.standard_normal(4).astype(np.float32)
        bf = (f.view(np.uint32) >> 16).astype("<u2")
        out.append({
            "pk": 10 * i, "f16": f.astype("<f2").tobytes(), "bf16": bf.tobytes(),
            "i8": rng.integers(-128, 128, 4).astype(np.int8).tobytes(), "bv": bytes([i, 255 - i]),
            "fv": [float(x) for x in rng.standard_normal(3).astype(np.float32)],
            "tz": times[i], "geo": None if shapes[i] is None else shapely.to_wkb(
                shapely.from_wkt(shapes[i]), flavor="iso", byte_order=1, output_dimension=3),
            "j": jsons[i], "arr": list(range(i)), "txt": f"text {i} \U0001F600", "$meta": b'{"dyn": %d}' % i})
    return out


def _insert_fields(schema, rows) -> list:
    """The log's FieldData for ``rows``, as Milvus's proxy writes them (independent of our encoders)."""
    out = []
    for f in schema.fields:
        vals = [r[f.name] for r in rows]
        fd = schema_pb2.FieldData(type=f.data_type, field_name=f.name, field_id=f.fieldID, is_dynamic=f.is_dynamic)
        if f.nullable:
            fd.valid_data.extend(v is not None for v in vals)
        t = f.data_type
        if t == DT.Int64:
            fd.scalars.long_data.data.extend(vals)
        elif t in (DT.Float16Vector, DT.BFloat16Vector, DT.Int8Vector, DT.BinaryVector):
            fd.vectors.dim = int(f.type_params[0].value)
            slot = {DT.Float16Vector: "float16_vector", DT.BFloat16Vector: "bfloat16_vector",
                    DT.Int8Vector: "int8_vector", DT.BinaryVector: "binary_vector"}[t]
            setattr(fd.vectors, slot, b"".join(vals))
        elif t == DT.FloatVector:
            fd.vectors.dim = 3
            fd.vectors.float_vector.data.extend(x for v in vals for x in v)
        elif t == DT.Timestamptz:
            fd.scalars.timestamptz_data.data.extend(0 if v is None else v for v in vals)
        elif t == DT.Geometry:
            fd.scalars.geometry_data.data.extend(b"" if v is None else v for v in vals)
        elif t == DT.JSON:
            fd.scalars.json_data.data.extend(vals)
        elif t == DT.Array:
            fd.scalars.array_data.element_type = DT.Int64
            for v in vals:
                fd.scalars.array_data.data.add().long_data.data.extend(v)
        elif t == DT.Text:
            fd.scalars.string_data.data.extend(vals)
        out.append(fd)
    return out


def test_snapshot_columns_equal_the_streams(milvus_proxy, tmp_path):
    schema, rows = _schema(), _rows()
    model = milvus_proxy.state.add_model("default", NAME, CID, ["dml_0"], [f"dml_0_{CID}v0"], schema,
                                         [("_default", 1)])
    with model.lock:
        model.put(rows)
    arrow = table_schema(collection_arrow_schema(schema), "pk")
    target = QueryTarget(MilvusSettings(milvus_config(milvus_proxy.address, tmp_path)), NAME, CID)
    snap = pa.Table.from_batches(list(RangeReader(target, "pk", False, arrow, 1).read([PkRange()])), schema=arrow)
    snap = snap.sort_by("pk")
    stream = InsertMsg.build(fields_data=_insert_fields(schema, rows), num_rows=N, timestamp=1).to_arrow(schema)
    assert snap.num_rows == N
    for name in stream.schema.names:
        want, got = stream.column(name), snap.column(name).combine_chunks()
        assert got.type == want.type, name
        assert got.equals(want), f"{name}: snapshot {got.to_pylist()} != stream {want.to_pylist()}"
    assert snap.column("j").to_pylist()[0] == '"a string"'  # the stored bytes, not re-serialized JSON
