"""``msgstream channels --collection`` and ``tail`` through the suite's Milvus proxy."""

from __future__ import annotations

import json

from msgstream_spark.cli.main import main
from tests.mq_milvus.test_dump import fill, now_tt
from tests.wal26 import producer as P


def _cli(capsys, *argv) -> tuple[int, list, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, [json.loads(line) for line in out.splitlines() if line.strip()], err


def _sets(proxy, tmp_path) -> list[str]:
    return ["--set", "mq.type=milvus", "--set", f"milvus.address={proxy.address}",
            "--set", f"milvus.metadataPath={tmp_path / 'meta.json'}"]


def test_channels_lists_a_collections_pchannels_and_vchannels(milvus_proxy, tmp_path, capsys):
    milvus_proxy.state.collections[("default", "docs")] = (P.COLLECTION, [P.PCHANNEL], [P.VCHANNEL])
    fill(milvus_proxy, P.PCHANNEL, [P.insert(now_tt() + i, [i]) for i in range(3)] + [P.timetick(now_tt() + 9)])
    code, out, err = _cli(capsys, "channels", *_sets(milvus_proxy, tmp_path), "--collection", "docs")
    assert code == 0, err
    assert out[0] == {"database": "default", "collection": "docs", "collection_id": P.COLLECTION,
                      "pchannels": [P.PCHANNEL], "vchannels": [P.VCHANNEL]}
    assert out[1]["channel"] == P.PCHANNEL and out[1]["messages"] == 3
    code, out, err = _cli(capsys, "channels", *_sets(milvus_proxy, tmp_path), "--collection", "nope")
    assert code != 0 and "collection 'nope' not found" in err


def test_tail_reads_through_the_proxy(milvus_proxy, tmp_path, capsys):
    fill(milvus_proxy, P.PCHANNEL, [P.insert(now_tt() + i, [i]) for i in range(3)] + [P.timetick(now_tt() + 9)])
    code, out, err = _cli(capsys, "tail", *_sets(milvus_proxy, tmp_path), "-c", P.PCHANNEL)
    assert code == 0, err
    assert len(out) == 3


def test_channels_from_a_login_shell_with_a_token_and_with_a_password(milvus_proxy, tmp_path):
    """USER (set by every login shell) once became milvus.user: a token was then 'both' (issue #19)."""
    import subprocess
    import sys

    from tests.fixtures.login_env import login_env
    milvus_proxy.state.tokens = {"tok", "alice:secret"}
    fill(milvus_proxy, P.PCHANNEL, [P.insert(now_tt() + i, [i]) for i in range(2)] + [P.timetick(now_tt() + 9)])
    cmd = [sys.executable, "-m", "msgstream_spark.cli.main", "channels", *_sets(milvus_proxy, tmp_path),
           "-c", P.PCHANNEL]
    for creds, env in ((["--set", "milvus.token=tok"], login_env()),
                       ([], login_env(MSGSTREAM_MILVUS_USER="alice", MSGSTREAM_MILVUS_PASSWORD="secret"))):
        proc = subprocess.run([*cmd, *creds], capture_output=True, text=True, timeout=120, env=env)
        assert proc.returncode == 0, proc.stderr
        assert json.loads(proc.stdout.splitlines()[0])["messages"] == 2
        assert "secret" not in proc.stderr + proc.stdout and "tok" not in proc.stderr
