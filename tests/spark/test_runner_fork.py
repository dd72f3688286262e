"""tests/fixtures/runner_fork.py: the suite session's streaming source runners forked from a server that imported
them once. Spark starts the interpreter script as ``SCRIPT -m pyspark.sql.streaming.python_streaming_source_runner``
with the port it must connect back to in its environment; here it is started the same way with no port, so the
runner fails at once, and what Spark would see of it (its stderr, its exit status) is checked."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.fixtures import runner_fork
from tests.fixtures.waits import wait_until

pytestmark = pytest.mark.slow  # a process SIGKILLed; pyspark's modules imported by a server (make test, not test-fast)


def _start(script: str, cwd) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON_WORKER_FACTORY")}
    return subprocess.run([script, "-m", runner_fork.RUNNER], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=120)


def test_a_runner_is_forked_from_the_server_and_its_status_and_stderr_reach_its_starter(tmp_path):
    sock = tmp_path / "sock"
    script = runner_fork.python_exec(tmp_path, sock)
    alone = _start(script, tmp_path)  # no server: the runner starts as Spark starts it
    assert alone.returncode == 1 and "Traceback" in alone.stderr and "in _child" not in alone.stderr, alone.stderr
    server = runner_fork.start(sock, tmp_path / "server.log")
    try:
        wait_until(sock.is_socket, 120, "the runner server listening", alive=lambda: _alive(server, tmp_path))
        forked = _start(script, tmp_path)
        assert forked.returncode == alone.returncode, forked.stderr[-2000:]
        # the same failure as the runner started alone, raised in a process the server forked
        assert alone.stderr.strip().splitlines()[-1] == forked.stderr.strip().splitlines()[-1], forked.stderr
        assert "runner_fork.py" in forked.stderr and "in _child" in forked.stderr
        other = subprocess.run([script, "-c", "import os, sys; print(sys.executable, os.getppid())"],
                               capture_output=True, text=True, timeout=60)  # any other command: the interpreter
        assert other.stdout.split() == [sys.executable, str(os.getpid())], other  # as given, no fork
    finally:
        runner_fork.stop(server, sock)
    assert server.returncode == 0 and not sock.exists(), (tmp_path / "server.log").read_text()[-2000:]


def _alive(server: subprocess.Popen, tmp_path) -> None:
    if server.poll() is not None:
        raise AssertionError(f"the server ended: {(tmp_path / 'server.log').read_text()[-2000:]}")


def test_a_forked_runner_gets_its_starters_environment_and_ends_when_its_starter_is_killed(tmp_path):
    """The runner connects back where its starter's environment says (a Unix socket here, no auth) and sends its
    pid, as it does to Spark: a process the server forked. SIGKILLing the starter (as a SIGKILLed driver's process
    group takes it) ends the runner: the connection it holds closes."""
    import signal
    import socket

    sock = tmp_path / "sock"
    script = runner_fork.python_exec(tmp_path, sock)
    server = runner_fork.start(sock, tmp_path / "server.log")
    back = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    back.bind(str(tmp_path / "back"))
    back.listen(1)
    back.settimeout(120)
    try:
        wait_until(sock.is_socket, 120, "the runner server listening", alive=lambda: _alive(server, tmp_path))
        env = {k: v for k, v in os.environ.items() if not k.startswith("PYTHON_WORKER_FACTORY")}
        env["PYTHON_WORKER_FACTORY_SOCK_PATH"] = str(tmp_path / "back")
        starter = subprocess.Popen([script, "-m", runner_fork.RUNNER], cwd=tmp_path, env=env,
                                   stderr=subprocess.DEVNULL)
        conn, _ = back.accept()
        conn.settimeout(120)
        pid = int.from_bytes(conn.recv(4), "big")
        ppid = int(open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[1])
        assert pid != starter.pid and ppid == server.pid, (pid, starter.pid, ppid, server.pid)
        starter.send_signal(signal.SIGKILL)
        starter.wait(60)
        assert conn.recv(1) == b""  # the runner ended (bounded by the timeout above)
        wait_until(lambda: _gone(pid), 60, "the forked runner gone (reaped by the server)")
    finally:
        back.close()
        runner_fork.stop(server, sock)


def _gone(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "Z"
    except (FileNotFoundError, ProcessLookupError):  # gone before the open, or reaped between the open and the read
        return True
