"""The ``msgstream`` CLI: every subcommand on the embedded backend, errors as one line."""

from __future__ import annotations

import base64
import json
import subprocess
import sys

import pytest

from msgstream_spark.cli.main import main
from tests.fixtures.login_env import login_env
from tests.sink.helpers import config_file, inserted_rows, read_all


def run_cli(capsys, *argv) -> tuple[int, list, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    lines = [json.loads(line) for line in out.splitlines() if line.strip()]
    return code, lines, err


@pytest.fixture
def published(local_env, tmp_path, capsys):
    """Two channels holding 300 synthetic rows (dim 8) and deletes of every 10th key."""
    cfg = config_file(local_env, tmp_path)
    chans = [local_env.new_channel("cli") for _ in range(2)]
    code, out, err = run_cli(capsys, "publish", "--config", cfg, "-c", ",".join(chans), "--synthetic", "300",
                             "--dim", "8", "--delete-fraction", "0.1", "--batch-rows", "100")
    assert code == 0, err
    return cfg, chans, out[-1]


def test_publish_writes_rows_and_deletes(published, local_env):
    cfg, chans, summary = published
    assert summary["inserted"] == 300 and summary["deleted"] == 30
    with local_env.client() as c:
        got = read_all(c, chans)
    pks = sorted(r["pk"] for ch in chans for r in inserted_rows(got[ch]))
    assert pks == list(range(300))
    assert all(len(r["vec"]) == 8 for ch in chans for r in inserted_rows(got[ch]))


def test_publish_a_file(local_env, tmp_path, capsys):
    import pyarrow as pa
    import pyarrow.parquet as pq

    cfg = config_file(local_env, tmp_path)
    ch = local_env.new_channel("file")
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"id": f"k{i}", "n": i}) + "\n" for i in range(25)))
    code, out, err = run_cli(capsys, "publish", "--config", cfg, "-c", ch, "--input", str(path), "--no-progress")
    assert code == 0, err
    assert out[-1]["inserted"] == 25
    pq.write_table(pa.table({"pk": list(range(5)), "x": [1.0] * 5}), tmp_path / "in.parquet")
    code, out, err = run_cli(capsys, "publish", "--config", cfg, "-c", ch, "-i", str(tmp_path / "in.parquet"))
    assert code == 0 and out[-1]["inserted"] == 5


def test_channels_lists_positions_and_counts(published, capsys):
    cfg, chans, summary = published
    code, out, err = run_cli(capsys, "channels", "--config", cfg, "-c", ",".join(chans))
    assert code == 0, err
    by = {row["channel"]: row for row in out}
    for ch in chans:
        assert by[ch]["messages"] == summary["channels"][ch]["messages"] + 1  # + the closing time tick
        assert by[ch]["latest"]["channel_name"] == ch and by[ch]["latest"]["base64"]
    code, out, _ = run_cli(capsys, "channels", "--config", cfg, "--no-count")
    assert {row["channel"] for row in out} >= set(chans)


def test_tail_earliest_limit_rows_and_from_position(published, capsys):
    cfg, chans, _ = published
    code, out, err = run_cli(capsys, "tail", "--config", cfg, "-c", chans[0], "--limit", "2", "--rows")
    assert code == 0, err
    assert len(out) == 2 and out[0]["msg_type"] == "Insert" and out[0]["channel"] == chans[0]
    assert len(out[0]["rows"]) == out[0]["num_rows"]
    code, out, _ = run_cli(capsys, "tail", "--config", cfg, "-c", chans[0], "--timeout", "0.5")
    types = [m["msg_type"] for m in out]
    assert types[-1] == "TimeTick" and "Delete" in types
    code, pos, _ = run_cli(capsys, "position", "--config", cfg, "-c", chans[0], "--at", str(out[1]["timestamp"]))
    assert code == 0 and pos[0]["msgID"] == out[1]["msgID"]
    code, after, err = run_cli(capsys, "tail", "--config", cfg, "-c", chans[0], "--from", pos[0]["base64"],
                               "--timeout", "0.5")
    assert code == 0, err
    # Milvus's seek: everything after it, except the first time tick (it ends the seek and is dropped)
    assert [m["msgID"] for m in after] == [m["msgID"] for m in out[1:-1]] and out[-1]["msg_type"] == "TimeTick"
    code, latest, _ = run_cli(capsys, "tail", "--config", cfg, "-c", chans[0], "--from", "latest", "--timeout", "0.3")
    assert code == 0 and latest == []
    code, followed, _ = run_cli(capsys, "tail", "--config", cfg, "-c", ",".join(chans), "--follow", "-n", "3",
                                "--no-ticks")
    assert code == 0 and len(followed) == 3 and all(m["msg_type"] != "TimeTick" for m in followed)


def test_position_latest_round_trips_as_base64(published, capsys):
    from msgstream_spark.msg.position import MsgPosition

    cfg, chans, _ = published
    code, out, err = run_cli(capsys, "position", "--config", cfg, "-c", ",".join(chans))
    assert code == 0, err
    assert [p["channel_name"] for p in out] == chans
    for p in out:
        pos = MsgPosition.from_base64(p["base64"])
        assert pos.channel_name == p["channel_name"] and pos.timestamp == p["timestamp"] > 0
        assert base64.b64encode(pos.msg_id).decode() == p["msgID"]


def test_inspect_decodes_a_raw_payload(published, local_env, tmp_path, capsys):
    cfg, chans, _ = published
    with local_env.client() as c:
        first = read_all(c, [chans[0]])[chans[0]][0]
    f = tmp_path / "payload.bin"
    f.write_bytes(first.raw.payload)
    code, out, err = run_cli(capsys, "inspect", "--file", str(f), "--rows")
    assert code == 0, err
    assert out[0]["msg_type"] == "Insert" and len(out[0]["rows"]) == first.msg.proto.num_rows
    code, out, _ = run_cli(capsys, "inspect", "--base64", base64.b64encode(first.raw.payload).decode())
    assert code == 0 and out[0]["proto"]["shardName"] == first.msg.proto.shardName


def test_errors_are_one_line_with_nonzero_exit(local_env, tmp_path, capsys):
    cfg = config_file(local_env, tmp_path)
    code, _, err = run_cli(capsys, "tail", "--config", cfg, "-c", "no-such-channel")
    assert code == 1 and err.count("\n") == 1 and "no-such-channel" in err
    code, _, err = run_cli(capsys, "inspect", "--base64", base64.b64encode(b"\xff\x00garbage").decode())
    assert code == 1 and err.startswith("msgstream inspect: error:") and err.count("\n") == 1
    code, _, err = run_cli(capsys, "position", "--config", str(tmp_path / "missing.yaml"), "-c", "x")
    assert code == 1 and "missing.yaml" in err
    with pytest.raises(SystemExit) as exc:
        main(["tail"])  # --channels is required
    assert exc.value.code == 2


def test_console_script_runs_as_a_process(local_env, tmp_path):
    cfg = config_file(local_env, tmp_path)
    proc = subprocess.run([sys.executable, "-m", "msgstream_spark.cli.main", "position", "--config", cfg,
                           "-c", "absent"], capture_output=True, text=True, timeout=120, env=login_env())
    assert proc.returncode == 1
    assert proc.stderr.strip().startswith("msgstream position: error:") and "absent" in proc.stderr
    proc = subprocess.run([sys.executable, "-m", "msgstream_spark.cli.main", "--help"], capture_output=True,
                          text=True, timeout=120, env=login_env())
    assert proc.returncode == 0 and "tail" in proc.stdout
