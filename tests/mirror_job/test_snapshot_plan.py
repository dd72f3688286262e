"""Snapshot planning without Spark or Milvus: range expressions (2.3.5's int64 literal trap), start positions,
the explicit milvus.address. (Cutting ranges and answers -> Arrow: tests/mq_milvus/test_snapshot_read.py and
test_snapshot_types.py.)"""

from __future__ import annotations

import json

import pytest

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.snapshot.handover import milvus_target, starting_positions
from msgstream_spark.mirror.snapshot.query.ranges import PkRange
from msgstream_spark.msg.position import MsgPosition


def test_range_expressions_never_write_the_int64_minimum():
    assert PkRange().expr("pk", False) == "pk < 0 or pk >= 0"
    assert PkRange(None, 5).expr("pk", False) == "pk < 5"
    assert PkRange(-9223372036854775807, None).expr("pk", False) == "pk >= -9223372036854775807"
    assert PkRange(3, 9).expr("pk", False) == "pk >= 3 and pk < 9"
    assert PkRange(3, 9, after=True).expr("pk", False) == "pk > 3 and pk < 9"
    assert PkRange().expr("key", True) == 'key >= ""'
    assert PkRange("a\"b", "k9").expr("key", True) == 'key >= "a\\"b" and key < "k9"'


def test_a_partitions_range_names_only_its_partition():
    assert PkRange(0, 10, partition="pa", partition_id=447).partition_names == ["pa"]
    assert PkRange().partition_names == []


def test_starting_positions_after_each_channel_or_earliest():
    p = MsgPosition("ch0", b"\x05\x00\x00\x00\x00\x00\x00\x00", "", 42)
    got = json.loads(starting_positions({"ch1": None, "ch0": p}))
    assert got == {"ch0": p.to_base64(), "ch1": "earliest"}


def test_a_snapshot_needs_milvus_address_set_explicitly(tmp_path, monkeypatch):
    from msgstream_spark.config.loader import Config

    monkeypatch.delenv("MILVUS_ADDRESS", raising=False)
    cfg_file = tmp_path / "c.yaml"
    cfg_file.write_text("mq:\n  type: local\nlocal:\n  path: x.db\n")
    cfg = Config.load(str(cfg_file), env={})
    with pytest.raises(MirrorError, match="milvus.address is not set in .*c.yaml.*or use --snapshot never"):
        milvus_target(cfg, "c1")
    with pytest.raises(MirrorError, match="mirror verify of collection 'c1'") as got:  # no mirror-run option
        milvus_target(cfg, "c1", purpose="verify")
    assert "--snapshot" not in str(got.value)
    t = milvus_target(cfg.with_overrides({"milvus.address": "h:1"}), "c1")
    assert t.uri == "http://h:1" and t.collection == "c1"
    cfg_file.write_text("mq:\n  type: local\nlocal:\n  path: x.db\nmilvus:\n  address: f:2\n")
    assert milvus_target(Config.load(str(cfg_file), env={}), "c1").address == "f:2"


def test_milvus_address_from_the_documented_variable_only(tmp_path, monkeypatch):
    """README: MSGSTREAM_MILVUS_ADDRESS sets milvus.address. It was refused as "not set" while MILVUS_ADDRESS
    passed the check and then connected to the built-in localhost:19530 (issue #38 item 8)."""
    from msgstream_spark.config.loader import Config

    monkeypatch.delenv("MILVUS_ADDRESS", raising=False)
    monkeypatch.setenv("MSGSTREAM_MILVUS_ADDRESS", "documented:19530")
    assert milvus_target(Config.load(), "c1").address == "documented:19530"
    monkeypatch.delenv("MSGSTREAM_MILVUS_ADDRESS")
    monkeypatch.setenv("MILVUS_ADDRESS", "unprefixed:19530")
    cfg = Config.load()
    assert cfg.get("milvus.address") == "localhost:19530" and not cfg.is_set("milvus.address")
    with pytest.raises(MirrorError, match="MILVUS_ADDRESS in the environment is not read.*MSGSTREAM_MILVUS_ADDRESS"):
        milvus_target(cfg, "c1")


def test_a_storage_snapshot_s_channels_start_after_their_own_checkpoints_in_the_database_job():
    """The storage route's start positions are each channel's checkpoint, S the oldest: a database job's table
    takes each channel's rows after that channel's checkpoint (the query starts at the earliest of every
    collection's positions), and a channel only ``latest`` names starts at the positions taken before the
    snapshots, never at the query's own "latest"."""
    from msgstream_spark.jobs.mirror_many import earliest
    from msgstream_spark.spark.channel_floor import channel_floors

    p0, p1 = (MsgPosition(ch, bytes([i + 1]) + b"\x00" * 7, "", ts) for i, (ch, ts) in enumerate([("c0", 40),
                                                                                                  ("c1", 55)]))
    storage = json.dumps({"c0": p0.to_base64(), "c1": p1.to_base64(), "c2": "latest"})
    assert channel_floors(storage, 40) == {"c1": 55}  # c0's rows after S=40 already; c2 has none of its rows
    assert channel_floors(starting_positions({"c0": p0, "c1": None}), 55) == {}  # a query snapshot: S covers all
    assert channel_floors(None, 40) == {} and channel_floors(storage, None) == {}
    q = MsgPosition("c1", b"\x09" + b"\x00" * 7, "", 50)
    now = MsgPosition("c2", b"\x03" + b"\x00" * 7, "", 30)
    got = json.loads(earliest([storage, starting_positions({"c1": q})], starting_positions({"c2": now})))
    assert got == {"c0": p0.to_base64(), "c1": q.to_base64(), "c2": now.to_base64()}
    assert json.loads(earliest([storage]))["c2"] == "latest"  # no positions taken: as the one-collection job
