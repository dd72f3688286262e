"""``--snapshot when_needed`` (issue #20) decides from the backend's own seek whether a resume position is
still readable: a real embedded log (SQLite) whose retention removed a prefix of the channel."""

from __future__ import annotations

import json

import pytest

from msgstream_spark.config import Config
from msgstream_spark.errors import OptionError
from msgstream_spark.mq.base import ProducerMessage
from msgstream_spark.mq.local.client import LocalClient
from msgstream_spark.msg.position import MsgPosition
from msgstream_spark.source.lost import checkpoint_offset, lost_positions, positions_offset
from msgstream_spark.source.offsets import entry


def _client(path) -> LocalClient:
    return LocalClient(Config.from_dict({"mq": {"type": "local"},
                                         "local": {"path": str(path), "retentionSizeInMB": 0.01}}))


def test_a_position_removed_by_retention_is_lost_and_a_retained_one_is_not(tmp_path):
    c = _client(tmp_path / "log.db")
    try:
        with c.create_producer("a") as p:
            ids = p.send_batch([ProducerMessage(b"x" * 1000) for _ in range(30)])
        with c.create_producer("b") as p:
            kept = p.send_batch([ProducerMessage(b"y") for _ in range(3)])
        before = {"a": entry(ids[0].serialize(), 5), "b": entry(kept[0].serialize(), 5, inclusive=True),
                  "c": entry(b"", 0)}
        assert lost_positions(c, before) == {}
        assert c.apply_retention("a") >= 20
        first = c.first_message_id("a")
        lost = lost_positions(c, before)
        assert set(lost) == {"a"}  # b untouched; c starts from whatever is retained
        assert "removed by retention" in lost["a"] and "after it" in lost["a"]
        # the last removed message as an exclusive start: the next one is retained, nothing is lost
        last_gone = c.bytes_to_message_id(ids[ids.index(first) - 1].serialize())
        assert lost_positions(c, {"a": entry(last_gone.serialize(), 0)}) == {}
        assert set(lost_positions(c, {"a": entry(last_gone.serialize(), 0, inclusive=True)})) == {"a"}
        assert lost_positions(c, {"a": entry(first.serialize(), 0, inclusive=True)}) == {}
        # a snapshot's recorded positions (Milvus-style, start AT the id) resolve to inclusive starts
        spec = json.dumps({"a": MsgPosition("a", ids[3].serialize(), "", 7).to_base64(), "b": "earliest"})
        off = positions_offset(spec, ["a", "b"])
        assert off["a"]["inclusive"] and off["b"]["msgID"] == ""
        assert set(lost_positions(c, off)) == {"a"}
    finally:
        c.close()


def test_checkpoint_offsets_file_and_bad_positions():
    text = 'v1\n{"batchWatermarkMs":0}\n{"ch_0": {"msgID": "AAE=", "ts": 3}}\n'
    assert checkpoint_offset(text) == {"ch_0": {"msgID": "AAE=", "ts": 3}}
    with pytest.raises(ValueError, match="got 1 line"):
        checkpoint_offset("v1\n")
    with pytest.raises(OptionError, match="not read"):
        positions_offset(json.dumps({"zz": "earliest"}), ["a"])
