"""The msgstream source and sink through Spark Connect: a client process talking to pyspark's Connect server.

The server runs from the project venv in a directory outside the repo (tests/fixtures/spark_connect.py); each
client call is a separate process (tests/spark_connect/client_app.py), as users run a Connect client.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.login_env import login_env
from tests.sink.helpers import deleted_keys, inserted_rows, read_all
from tests.spark.helpers import Publisher, spark_options

APP = Path(__file__).with_name("client_app.py")

pytestmark = pytest.mark.slow


def client(url: str, cwd: Path, **spec) -> dict:
    """Run one client program against the server at ``url`` and return what it printed."""
    env = {k: v for k, v in login_env().items() if k not in ("PYTHONPATH", "SPARK_CONNECT_MODE_ENABLED")}
    cmd = [sys.executable, str(APP), json.dumps({"url": url, **spec})]
    try:
        done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"the Connect client did not finish within 300 s\n{e.stdout}\n{e.stderr}")
    assert done.returncode == 0, f"client exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-6000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.fixture
def env(local_env):
    return local_env


@pytest.fixture(params=["local", "kafka", "pulsar"])
def any_env(request):
    return request.getfixturevalue(f"{request.param}_env")


@pytest.fixture
def pub(env):
    c = env.client()
    p = Publisher(c, [env.new_channel("dml"), env.new_channel("dml")])
    yield p
    p.close()
    c.close()


def source_options(env, pub) -> dict:
    return {**spark_options(env), "channels": ",".join(pub.channels)}


def published_rows(pub) -> list:
    names = {pk: (None if pk % 5 == 0 else f"n{pk}") for _, pk, _ in pub.published}  # Publisher's names
    return sorted([op, pk, names[pk] if op == "insert" else None] for op, pk, _ in pub.published)


def test_batch_read_autoregistered_on_the_server(spark_connect_url, any_env, tmp_path):
    env = any_env
    c = env.client()
    pub = Publisher(c, [env.new_channel("dml"), env.new_channel("dml")])
    try:
        pub.rounds(2, rows=3)
        pub.delete(pub.channels[0], [0, 1])
        pub.tick()
        got = client(spark_connect_url, tmp_path, action="read", options=source_options(env, pub))
    finally:
        pub.close()
        c.close()
    assert got["msgstream"] == published_rows(pub)


def test_batch_read_after_client_side_registration(spark_connect_url, env, pub, tmp_path):
    pub.rounds(2, rows=4)
    # "msgstream_client" is a name only the client's registration knows.
    got = client(spark_connect_url, tmp_path, action="read", options=source_options(env, pub), register=True,
                 formats=["msgstream", "msgstream_client"])
    assert got["msgstream"] == got["msgstream_client"] == published_rows(pub)


def test_streaming_available_now_restart_continues_exactly(spark_connect_url, env, pub, tmp_path):
    spec = {"action": "stream", "options": source_options(env, pub), "subscription": "connect-restart",
            "checkpoint": str(tmp_path / "chk"), "out": str(tmp_path / "out")}
    pub.rounds(2)
    first = client(spark_connect_url, tmp_path, **spec)
    assert first["finished"] and first["rows"] == published_rows(pub)  # 40 rows
    pub.rounds(2)
    second = client(spark_connect_url, tmp_path, **spec)  # a new client process, the same checkpoint
    assert second["finished"]
    assert len(second["rows"]) == 80 and second["rows"] == published_rows(pub)  # the new 40 added, none twice


def test_batch_write(spark_connect_url, env, tmp_path):
    channels = [env.new_channel("w"), env.new_channel("w")]
    rows = [[pk, [float(pk), pk / 2.0], f"r{pk}"] for pk in range(20)]
    opts = {**spark_options(env), "channels": ",".join(channels), "collection": "connect_write"}
    assert client(spark_connect_url, tmp_path, action="write", options=opts, rows=rows) == {"written": 20}
    c = env.client()
    try:
        reads = read_all(c, channels)
    finally:
        c.close()
    got = sorted([r["pk"], r["vec"], r["name"]] for ch in channels for r in inserted_rows(reads[ch]))
    assert got == rows
    assert all(inserted_rows(reads[ch]) for ch in channels)  # sharded over both channels


def test_streaming_write(spark_connect_url, env, pub, tmp_path):
    pub.rounds(2, rows=3)
    pub.delete(pub.channels[1], [3, 4])
    pub.tick()
    targets = [env.new_channel("copy"), env.new_channel("copy")]
    sink = {**spark_options(env), "channels": ",".join(targets), "collection": "connect_copy",
            "writerId": "connect-copy"}
    got = client(spark_connect_url, tmp_path, action="stream_write", options=source_options(env, pub),
                 subscription="connect-copy", checkpoint=str(tmp_path / "chk"), sink_options=sink)
    assert got["finished"]
    c = env.client()
    try:
        reads = read_all(c, targets)
    finally:
        c.close()
    copied = sorted(r["pk"] for ch in targets for r in inserted_rows(reads[ch]))
    assert copied == list(range(12))
    assert sorted(k for ch in targets for k in deleted_keys(reads[ch])) == [3, 4]
