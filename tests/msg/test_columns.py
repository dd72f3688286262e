"""Every data type of wire doc §8.3, with nulls, through Arrow -> FieldData -> bytes -> Arrow."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from msgstream_spark.errors import SchemaError
from msgstream_spark.msg import codec
from msgstream_spark.msg.columns import arrow_to_field_data, arrow_type_for, field_data_to_arrow
from msgstream_spark.msg.schema import (
    collection_arrow_schema,
    field_schema_from_arrow,
    infer_collection_schema,
)
from msgstream_spark.msg.types import InsertMsg

N = 5


def _f16(vals):
    return np.asarray(vals, np.float32).astype(np.float16).astype(np.float32).tolist()


def _bf16(vals):
    u = np.asarray(vals, np.float32).view(np.uint32) & np.uint32(0xFFFF0000)
    return u.view(np.float32).tolist()


# name -> (milvus type name, arrow values, nullable, dim)
COLUMNS = {
    "pk": ("Int64", pa.array([1, 2, 3, 4, 5], pa.int64()), False, None),
    "b": ("Bool", pa.array([True, None, False, True, None]), True, None),
    "i8": ("Int8", pa.array([-128, 0, None, 127, 1], pa.int8()), True, None),
    "i16": ("Int16", pa.array([-32768, 5, 6, None, 32767], pa.int16()), True, None),
    "i32": ("Int32", pa.array([None, 2**31 - 1, -(2**31), 0, 7], pa.int32()), True, None),
    "i64": ("Int64", pa.array([2**63 - 1, None, -(2**63), 0, 1], pa.int64()), True, None),
    "f": ("Float", pa.array([1.5, None, -2.25, 0.0, 3.0], pa.float32()), True, None),
    "d": ("Double", pa.array([1e300, -1e-300, None, 0.5, 2.0], pa.float64()), True, None),
    "s": ("VarChar", pa.array(["a", "", None, "héllo", "x" * 300]), True, None),
    "j": ("JSON", pa.array(['{"a": 1}', None, "[1,2]", '"s"', "null"]), True, None),
    "arr_i": ("Array:Int32", pa.array([[1, 2], [], None, [3], [4, 5, 6]], pa.list_(pa.int32())), True, None),
    "arr_s": ("Array:VarChar", pa.array([["a"], ["b", "c"], [], None, ["d"]], pa.list_(pa.string())), True, None),
    "fv": ("FloatVector", pa.array([[0.5 * i + k for k in range(4)] for i in range(N)], pa.list_(pa.float32())),
           False, 4),
    "f16": ("Float16Vector", pa.array([_f16([0.1 * i, 1.0, -2.5]) for i in range(N)], pa.list_(pa.float32())),
            False, 3),
    "bf16": ("BFloat16Vector", pa.array([_bf16([0.3 * i, 7.0, -1.1]) for i in range(N)], pa.list_(pa.float32())),
             False, 3),
    "i8v": ("Int8Vector", pa.array([[i, -i, 127, -128] for i in range(N)], pa.list_(pa.int8())), False, 4),
    "bv": ("BinaryVector", pa.array([bytes([i, 255 - i]) for i in range(N)], pa.binary()), False, 16),
    "sp": ("SparseFloatVector", pa.array([[(1, 0.5), (10, 2.0)], [], [(4294967294, 1.0)], [(0, 0.0)], [(7, 3.5)]],
                                         pa.map_(pa.int64(), pa.float32())), False, None),
}


def _field_schema(name, spec, fid):
    tname, values, nullable, dim = spec
    if tname.startswith("Array:"):
        return field_schema_from_arrow(name, values.type, field_id=fid, nullable=nullable)
    return field_schema_from_arrow(name, values.type, field_id=fid, nullable=nullable, dim=dim,
                                   milvus_type=tname, is_primary_key=(name == "pk"))


def test_every_type_roundtrips_through_the_wire_with_nulls():
    schemas = {n: _field_schema(n, spec, 100 + i) for i, (n, spec) in enumerate(COLUMNS.items())}
    fds = [arrow_to_field_data(spec[1], schemas[n]) for n, spec in COLUMNS.items()]
    msg = InsertMsg.build(fields_data=fds, num_rows=N, timestamp=1000, collection_id=1, msg_id=9)
    back = codec.unmarshal(*codec.marshal(msg), channel="c")
    batch = back.to_arrow()
    for name, (_tname, values, _, _) in COLUMNS.items():
        got = batch.column(name)
        assert got.type == arrow_type_for(schemas[name]), name
        want = values.cast(got.type) if values.type != got.type else values
        assert got.to_pylist() == want.to_pylist(), name
    # null slots are zero values + valid_data on the wire, as Milvus's proxy writes them
    b = next(f for f in back.proto.fields_data if f.field_name == "b")
    assert list(b.valid_data) == [True, False, True, True, False]
    assert list(b.scalars.bool_data.data) == [True, False, False, True, False]
    pk = next(f for f in back.proto.fields_data if f.field_name == "pk")
    assert len(pk.valid_data) == 0


def test_inferred_schema_matches_the_data():
    schemas = {n: _field_schema(n, spec, 100 + i) for i, (n, spec) in enumerate(COLUMNS.items())}
    fds = [arrow_to_field_data(spec[1], schemas[n]) for n, spec in COLUMNS.items()]
    msg = InsertMsg.build(fields_data=fds, num_rows=N, timestamp=1000)
    inferred = infer_collection_schema(msg.proto, "coll")
    assert [f.name for f in inferred.fields if f.is_primary_key] == ["pk"]
    arrow = collection_arrow_schema(inferred)
    assert arrow.names == list(COLUMNS)
    assert arrow.field("fv").type == pa.list_(pa.float32())
    assert arrow.field("sp").type == pa.map_(pa.int64(), pa.float32())
    fv = next(f for f in inferred.fields if f.name == "fv")
    assert {p.key: p.value for p in fv.type_params}["dim"] == "4"
    assert next(f for f in inferred.fields if f.name == "b").nullable


def test_float_vector_is_columnar_and_accepts_fixed_size_lists():
    vals = np.arange(12, dtype=np.float32)
    fsl = pa.FixedSizeListArray.from_arrays(pa.array(vals), 3)
    fs = field_schema_from_arrow("v", fsl.type, field_id=101)
    assert {p.key: p.value for p in fs.type_params}["dim"] == "3"
    fd = arrow_to_field_data(fsl, fs)
    assert fd.vectors.dim == 3
    assert field_data_to_arrow(fd).to_pylist() == vals.reshape(4, 3).tolist()


def test_schema_errors_name_the_column():
    fs = field_schema_from_arrow("v", pa.list_(pa.float32()), field_id=101, dim=3)
    with pytest.raises(SchemaError, match="'v'.*row 1 has dimension 2"):
        arrow_to_field_data(pa.array([[1, 2, 3], [1, 2]], pa.list_(pa.float32())), fs)
    pk = field_schema_from_arrow("pk", pa.int64(), field_id=100, is_primary_key=True)
    with pytest.raises(SchemaError, match="'pk' is not nullable but row 1 is null"):
        arrow_to_field_data(pa.array([1, None]), pk)
    with pytest.raises(SchemaError, match="primary key column 'x' must be Int64 or VarChar"):
        field_schema_from_arrow("x", pa.float64(), field_id=100, is_primary_key=True)
    with pytest.raises(SchemaError, match="no Milvus equivalent"):
        field_schema_from_arrow("t", pa.duration("us"), field_id=100)
    sp = field_schema_from_arrow("sp", pa.map_(pa.int64(), pa.float32()), field_id=101)
    with pytest.raises(SchemaError, match="repeats a sparse index"):
        arrow_to_field_data(pa.array([[(1, 1.0), (1, 2.0)]], pa.map_(pa.int64(), pa.float32())), sp)
    i8 = field_schema_from_arrow("small", pa.int8(), field_id=102)
    with pytest.raises(SchemaError, match="'small'"):
        arrow_to_field_data(pa.array([1000], pa.int64()), i8)


def test_sparse_rows_are_sorted_by_index_on_write():
    sp = field_schema_from_arrow("sp", pa.map_(pa.int64(), pa.float32()), field_id=101)
    fd = arrow_to_field_data(pa.array([[(9, 1.0), (2, 2.0)]], pa.map_(pa.int64(), pa.float32())), sp)
    assert field_data_to_arrow(fd).to_pylist() == [[(2, 2.0), (9, 1.0)]]
    assert fd.vectors.sparse_float_vector.dim == 10


def test_every_type_roundtrips_through_the_embedded_log(tmp_path):
    from msgstream_spark.msg.types import MsgPack
    from msgstream_spark.stream import Factory

    schemas = {n: _field_schema(n, spec, 100 + i) for i, (n, spec) in enumerate(COLUMNS.items())}
    fds = [arrow_to_field_data(spec[1], schemas[n]) for n, spec in COLUMNS.items()]
    msg = InsertMsg.build(fields_data=fds, num_rows=N, timestamp=1000, collection_id=1, msg_id=9, hash_values=[0])
    f = Factory({"mq": {"type": "local"}, "local": {"path": str(tmp_path / "log.db")}})
    with f.msgstream() as out:
        out.as_producer(["types"])
        out.produce(MsgPack([msg]))
    with f.msgstream() as inp:
        inp.as_consumer(["types"], "types-reader", "earliest")
        pack = inp.consume(timeout=2)
    batch = pack.msgs[0].to_arrow()
    for name, (_t, values, _n, _d) in COLUMNS.items():
        got = batch.column(name)
        want = values.cast(got.type) if values.type != got.type else values
        assert got.to_pylist() == want.to_pylist(), name
