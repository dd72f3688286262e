"""Where ``--snapshot when_needed`` looks for the resume position (issue #20): Spark-free, real files."""

from __future__ import annotations

import json

import pytest

from msgstream_spark.errors import MirrorError
from msgstream_spark.jobs.mirror_start import resume_offset
from msgstream_spark.msg.position import MsgPosition


def _offsets(ch: str, msg_id: str) -> str:
    return "v1\n" + json.dumps({"batchWatermarkMs": 0}) + "\n" + json.dumps({ch: {"msgID": msg_id, "ts": 1}}) + "\n"


def test_the_last_committed_batch_of_the_checkpoint_wins_over_recorded_positions(tmp_path):
    cp = tmp_path / "cp"
    (cp / "offsets").mkdir(parents=True)
    (cp / "commits").mkdir()
    for b, mid in ((0, "AAE="), (1, "AAI="), (2, "AAM=")):
        (cp / "offsets" / str(b)).write_text(_offsets("ch_0", mid))
    for b in (0, 1):  # batch 2 planned, not committed: Spark re-runs it from batch 1's end
        (cp / "commits" / str(b)).write_text("v1\n{}\n")
    recorded = json.dumps({"ch_0": MsgPosition("ch_0", b"\x00\x09", "", 5).to_base64()})
    assert resume_offset(str(cp), recorded) == {"ch_0": {"msgID": "AAI=", "ts": 1}}
    (cp / "offsets" / "1").write_text("v1\n")
    with pytest.raises(MirrorError, match="offsets/1"):
        resume_offset(str(cp), recorded)


def test_without_a_checkpoint_the_recorded_positions_start_at_their_ids(tmp_path):
    recorded = json.dumps({"ch_0": MsgPosition("ch_0", b"\x00\x09", "", 5).to_base64(), "ch_1": "earliest"})
    assert resume_offset(str(tmp_path / "none"), recorded) == {
        "ch_0": {"msgID": "AAk=", "ts": 5, "inclusive": True}, "ch_1": {"msgID": "", "ts": 0}}
    assert resume_offset(str(tmp_path / "none"), "earliest") == {}
    assert resume_offset(str(tmp_path / "none"), None) == {}
