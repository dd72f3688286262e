"""The msgstream source and sink through Spark Connect: a client process talking to pyspark's Connect server.

The server runs from the project venv in a directory outside the repo (tests/fixtures/spark_connect.py); the
client calls run in a process apart from the tests' (tests/spark_connect/client_app.py), as users run a Connect
client: one client process for the module's calls (``shared_client``; those that register nothing share a Connect
session, one that registers the source from the client has its own), and a process of its own for each run of the
restart test (a new client process, the same checkpoint).
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


def _client_env() -> dict[str, str]:
    return {k: v for k, v in login_env().items() if k not in ("PYTHONPATH", "SPARK_CONNECT_MODE_ENABLED")}


class SharedClient:
    """One client program (``client_app.py -``) that runs the specs sent to it (``client_app.serve``: one Connect
    session for those that register nothing), in a directory outside the repo; its answers are read with a bound
    (a reader thread, a queue)."""

    def __init__(self, cwd: Path) -> None:
        import queue
        import threading

        self.proc = subprocess.Popen([sys.executable, str(APP), "-"], cwd=cwd, env=_client_env(), text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.lines: queue.Queue = queue.Queue()
        self.err: list[str] = []
        threading.Thread(target=self._pump, args=(self.proc.stdout, self.lines.put), daemon=True).start()
        threading.Thread(target=self._pump, args=(self.proc.stderr, self.err.append), daemon=True).start()

    @staticmethod
    def _pump(stream, put) -> None:
        for line in stream:
            put(line)

    def __call__(self, url: str, **spec) -> dict:
        import queue

        assert self.proc.poll() is None, f"the shared Connect client exited {self.proc.returncode}\n" + \
            "".join(self.err)[-6000:]
        self.proc.stdin.write(json.dumps({"url": url, **spec}) + "\n")
        self.proc.stdin.flush()
        while True:
            try:
                line = self.lines.get(timeout=300)
            except queue.Empty:
                pytest.fail("the shared Connect client gave no answer within 300 s\n" + "".join(self.err)[-6000:])
            if line.startswith("{"):  # its JSON answer (anything else it printed is shown on failure)
                got = json.loads(line)
                assert "error" not in got, got["error"] + "".join(self.err)[-3000:]
                return got

    def close(self) -> None:
        self.proc.stdin.close()
        try:
            self.proc.wait(60)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)


@pytest.fixture(scope="module")
def shared_client(tmp_path_factory):
    c = SharedClient(tmp_path_factory.mktemp("connect-client"))
    yield c
    c.close()


def client(url: str, cwd: Path, **spec) -> dict:
    """Run one client program of its own against the server at ``url`` and return what it printed."""
    cmd = [sys.executable, str(APP), json.dumps({"url": url, **spec})]
    try:
        done = subprocess.run(cmd, cwd=cwd, env=_client_env(), capture_output=True, text=True, timeout=300)
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


def test_batch_read_autoregistered_on_the_server(spark_connect_url, any_env, shared_client):
    env = any_env
    c = env.client()
    pub = Publisher(c, [env.new_channel("dml"), env.new_channel("dml")])
    try:
        pub.rounds(2, rows=3)
        pub.delete(pub.channels[0], [0, 1])
        pub.tick()
        got = shared_client(spark_connect_url, action="read", options=source_options(env, pub))
    finally:
        pub.close()
        c.close()
    assert got["msgstream"] == published_rows(pub)


def test_batch_read_after_client_side_registration(spark_connect_url, env, pub, shared_client):
    pub.rounds(2, rows=4)
    # "msgstream_client" is a name only the client's registration knows.
    got = shared_client(spark_connect_url, action="read", options=source_options(env, pub), register=True,
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


def test_batch_write(spark_connect_url, env, shared_client):
    channels = [env.new_channel("w"), env.new_channel("w")]
    rows = [[pk, [float(pk), pk / 2.0], f"r{pk}"] for pk in range(20)]
    opts = {**spark_options(env), "channels": ",".join(channels), "collection": "connect_write"}
    assert shared_client(spark_connect_url, action="write", options=opts, rows=rows) == {"written": 20}
    c = env.client()
    try:
        reads = read_all(c, channels)
    finally:
        c.close()
    got = sorted([r["pk"], r["vec"], r["name"]] for ch in channels for r in inserted_rows(reads[ch]))
    assert got == rows
    assert all(inserted_rows(reads[ch]) for ch in channels)  # sharded over both channels


def test_streaming_write(spark_connect_url, env, pub, tmp_path, shared_client):
    pub.rounds(2, rows=3)
    pub.delete(pub.channels[1], [3, 4])
    pub.tick()
    targets = [env.new_channel("copy"), env.new_channel("copy")]
    sink = {**spark_options(env), "channels": ",".join(targets), "collection": "connect_copy",
            "writerId": "connect-copy"}
    got = shared_client(spark_connect_url, action="stream_write", options=source_options(env, pub),
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
