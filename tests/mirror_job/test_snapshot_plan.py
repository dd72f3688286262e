"""Snapshot planning without Spark or Milvus: range expressions (2.3.5's int64 literal trap), cuts by
keys, query rows -> Arrow (dynamic keys under $meta, binary vectors, the snapshot's change order)."""

from __future__ import annotations

import json

import numpy as np
import pyarrow as pa
import pytest

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.order import seq_parts, snapshot_seq
from msgstream_spark.mirror.snapshot import CollectionInfo, PkRange, cut, milvus_target, starting_positions, to_batch
from msgstream_spark.msg.position import MsgPosition


def test_range_expressions_never_write_the_int64_minimum():
    assert PkRange().expr("pk", False) == "pk < 0 or pk >= 0"
    assert PkRange(None, 5).expr("pk", False) == "pk < 5"
    assert PkRange(-9223372036854775807, None).expr("pk", False) == "pk >= -9223372036854775807"
    assert PkRange(3, 9).expr("pk", False) == "pk >= 3 and pk < 9"
    assert PkRange().expr("key", True) == 'key >= ""'
    assert PkRange("a\"b", "k9").expr("key", True) == 'key >= "a\\"b" and key < "k9"'


def test_cut_covers_the_range_without_overlap():
    keys = list(range(0, 100, 3))  # 34 keys
    pieces = cut(PkRange(None, None), keys, 10)
    assert pieces[0].lo is None and pieces[-1].hi is None
    assert all(a.hi == b.lo for a, b in zip(pieces, pieces[1:]))
    counts = [sum(1 for k in keys if (p.lo is None or k >= p.lo) and (p.hi is None or k < p.hi)) for p in pieces]
    assert counts == [10, 10, 10, 4]
    assert cut(PkRange(5, 7), [5, 6], 10) == [PkRange(5, 7)]


def test_a_partitions_ranges_keep_the_partition_and_its_rows_carry_its_id():
    whole = PkRange(partition="pa", partition_id=447)
    pieces = cut(whole, list(range(25)), 10)
    assert [(p.lo, p.hi) for p in pieces] == [(None, 10), (10, 20), (20, None)]
    assert all(p.partition_names == ["pa"] and p.partition_id == 447 for p in pieces)
    assert PkRange().partition_names is None
    info = CollectionInfo(7, "pk", False, ("pk",), False, 2)
    schema = pa.schema([pa.field("pk", pa.int64(), False), ("_ts", pa.int64()), ("_seq", pa.decimal128(38, 0)),
                        ("_partition", pa.int64())])
    rows = [{"pk": 1}, {"pk": 2}]
    assert to_batch(rows, schema, info, 5, 447).column(3).to_pylist() == [447, 447]
    assert to_batch(rows, schema, info, 5).column(3).to_pylist() == [None, None]


def test_query_rows_become_the_tables_columns():
    info = CollectionInfo(7, "pk", False, ("pk", "j", "fv", "bv"), True, 2)
    schema = pa.schema([pa.field("pk", pa.int64(), False), ("j", pa.string()), ("fv", pa.list_(pa.float32())),
                        ("bv", pa.binary()), ("$meta", pa.string()), ("_ts", pa.int64()),
                        ("_seq", pa.decimal128(38, 0)), ("_partition", pa.int64())])
    rows = [{"pk": 1, "j": {"a": 1}, "fv": [0.1, 2.5], "bv": [b"\x01\x02"], "dyn": 5},
            {"pk": 2, "j": None, "fv": [1.0, -1.0], "bv": [b"\x00\xff"]}]
    s = (1 << 18) * 1_700_000_000_000
    b = to_batch(rows, schema, info, s)
    assert b.schema == schema
    assert b.column(0).to_pylist() == [1, 2]
    assert [json.loads(x) if x else x for x in b.column(1).to_pylist()] == [{"a": 1}, None]
    assert b.column(2).to_pylist()[0] == [float(np.float32(0.1)), 2.5]
    assert b.column(3).to_pylist() == [b"\x01\x02", b"\x00\xff"]
    assert [json.loads(x) for x in b.column(4).to_pylist()] == [{"dyn": 5}, {}]
    assert b.column(5).to_pylist() == [s, s]
    assert {int(v) for v in b.column(6).to_pylist()} == {snapshot_seq(s)}
    assert seq_parts(int(b.column(6)[0].as_py()))[0] == s
    assert b.column(7).null_count == 2


def test_starting_positions_after_each_channel_or_earliest():
    p = MsgPosition("ch0", b"\x05\x00\x00\x00\x00\x00\x00\x00", "", 42)
    got = json.loads(starting_positions({"ch1": None, "ch0": p}))
    assert got == {"ch0": p.to_base64(), "ch1": "earliest"}


def test_a_snapshot_needs_milvus_address_set_explicitly(tmp_path, monkeypatch):
    from msgstream_spark.config.loader import Config

    monkeypatch.delenv("MILVUS_ADDRESS", raising=False)
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("mq:\n  type: local\nlocal:\n  path: x.db\n")
    cfg = Config.load(str(cfg_file))
    with pytest.raises(MirrorError, match="milvus.address is not set in .*c.yaml"):
        milvus_target(cfg, str(cfg_file), {}, "c1")
    t = milvus_target(cfg.with_overrides({"milvus.address": "h:1"}), str(cfg_file), {"milvus.address": "h:1"}, "c1")
    assert t.uri == "http://h:1" and t.collection == "c1"
