"""A real Milvus 2.3.5 standalone (PyPI ``milvus``, "embedded Milvus") writing to Kafka or Pulsar.

The wheel is fetched once with ``pip download`` and its lzma-compressed binaries unpacked into
``~/.cache/msgstream-spark/milvus-2.3.5`` (override: ``MSGSTREAM_CACHE``). Each server runs from a
fresh temp dir with the package's config template: ``mq.type`` kafka (tansu through the shim) or
pulsar (pulsar-lite) instead of rocksmq (see :class:`MQ`), embedded etcd, local storage, every port
free. ``stop`` kills by pid; ``log_tail`` is shown when a test fails.
"""

from __future__ import annotations

import contextlib
import lzma
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import warnings
import weakref
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tests.fixtures.ports import free_port

VERSION = "2.3.5"
WHEEL = f"milvus-{VERSION}-py3-none-manylinux2014_x86_64.whl"
PORT_KEYS = ("etcd_port", "root_coord_port", "proxy_port", "proxy_internal_port", "query_coord_port",
             "query_node_port", "index_coord_port", "index_node_port", "data_coord_port", "data_node_port")
_PLACEHOLDER = re.compile(r"\{\{\s*(\w+)(?:\((\w+)\))?\s*(?::\s*([^}]*?))?\s*\}\}")


def cache_dir() -> Path:
    return Path(os.environ.get("MSGSTREAM_CACHE", Path.home() / ".cache" / "msgstream-spark"))


def install(timeout: float = 300.0) -> Path:
    """The unpacked server (bin/, config template), downloading the wheel on first use."""
    home = cache_dir() / f"milvus-{VERSION}"
    if (home / ".complete").exists():
        return home
    wheels = cache_dir() / "wheels"
    wheel = wheels / WHEEL
    if not wheel.exists():
        wheels.mkdir(parents=True, exist_ok=True)
        subprocess.run([sys.executable, "-m", "pip", "download", "-q", "--no-deps", f"milvus=={VERSION}",
                        "--only-binary", ":all:", "-d", str(wheels)], check=True, timeout=timeout)
    tmp = Path(tempfile.mkdtemp(prefix=f"milvus-{VERSION}-", dir=cache_dir()))
    (tmp / "bin").mkdir()
    with zipfile.ZipFile(wheel) as z:
        for name in z.namelist():
            if name.startswith("milvus/data/bin/") and name.endswith(".lzma"):
                (tmp / "bin" / Path(name).name[:-5]).write_bytes(lzma.decompress(z.read(name)))
            elif name in ("milvus/data/config.yaml.template", "milvus/data/glog.conf"):
                (tmp / Path(name).name).write_bytes(z.read(name))
    (tmp / "bin" / "milvus").chmod(0o755)
    (tmp / ".complete").touch()
    shutil.rmtree(home, ignore_errors=True)
    tmp.rename(home)
    return home


@dataclass(frozen=True)
class MQ:
    """The message queue Milvus writes to: ``mq.type`` and the keys of its config section."""

    type: str  # "kafka" or "pulsar"
    settings: dict[str, object]


def kafka_mq(brokers: str) -> MQ:
    """``readTimeout``: the seconds one read of Milvus's Kafka consumer waits for a message (default 10; a
    timeout is logged and the read repeated, pkg/mq/msgstream/mqwrapper/kafka/kafka_consumer.go). Closing a consumer
    waits for the read in flight, and a dropped collection's channels get no more messages: the data node took 10 s
    to release each channel of a collection a test dropped, and watched the next test's new collection's channels
    only after that, so its first flush waited up to 15 s (measured). Nothing is read differently."""
    return MQ("kafka", {"brokerList": brokers, "readTimeout": 1})


def pulsar_mq(host: str, port: int, web_port: int) -> MQ:
    """Milvus dials ``pulsar://<address>:<port>``; ``webport`` serves only the subscription clean-up on a drop."""
    return MQ("pulsar", {"address": host, "port": port, "webport": web_port})


def _set_section(text: str, section: str, settings: dict[str, object]) -> str:
    """``settings`` written into the template's top-level ``section`` (appended when it has none)."""
    m = re.search(rf"(?m)^{section}:\n((?:[ \t]+.*\n|[ \t]*\n)*)", text)
    if m is None:
        return text + f"\n{section}:\n" + "".join(f"  {k}: {v}\n" for k, v in settings.items())
    body = m.group(1)
    for k, v in settings.items():
        body, n = re.subn(rf"(?m)^  {k}:.*$", f"  {k}: {v}", body)
        if n == 0:
            body = f"  {k}: {v}\n" + body
    return text[:m.start(1)] + body + text[m.end(1):]


# Milvus's own intervals, shortened for a test server: each a key of Milvus 2.3.5's config (milvus.yaml), in the key's
# own unit. What each one made the tests wait for, and why the tests still prove the same with it:
TUNING: dict[str, object] = {
    # ms a proxy's segment allocation stays valid (default 2000). The data coordinator flushes a sealed segment only
    # once its channel's time passes the segment's last allocation's expiry (internal/datacoord
    # segment_allocation_policy.go, flushPolicyV1: ``GetLastExpireTime() <= t``), so every flush (pymilvus's, the
    # storage snapshot's) took >= 2 s. Rows are still assigned only under an unexpired allocation and flushed after
    # it expires, whatever its length; the proxy asks for allocations more often. The template's warning (never lower
    # it across a restart) is about data written under the old value: each test server starts on an empty directory.
    "dataCoord.segment.assignmentExpiration": 200,
    # ms between the query coordinator's rounds (defaults 1000, 1000, 1000, 500): its task scheduler, its channel and
    # segment checkers (compare the load target with what the query node holds, make the load tasks) and its pull of
    # the query node's distribution. A load waits for several rounds; what is loaded and when a load counts as done
    # (querycoordv2 observers/collection_observer.go, every second: a constant) are unchanged. Cost: +0.15 s of
    # Milvus CPU per 30 s with a loaded collection (1.29 against 1.14 s, measured).
    "queryCoord.checkInterval": 100,
    "queryCoord.checkChannelInterval": 100,
    "queryCoord.checkSegmentInterval": 100,
    "queryCoord.distPullInterval": 100,
}


def _set_key(text: str, key: str, value: object) -> str:
    """The dotted ``key`` (``dataCoord.segment.assignmentExpiration``) set to ``value`` in the config ``text`` as the
    template writes it (two spaces a level; a comment after the value is kept). A last key its section lacks is
    added at the section's top; a missing section is an error (not the template this was written for)."""
    parts = key.split(".")
    start, end = 0, len(text)  # where the key is looked for: the whole text, then each section's body
    for depth, name in enumerate(parts):
        indent = "  " * depth
        m = re.compile(rf"(?m)^{indent}{re.escape(name)}:(.*)$").search(text, start, end)
        last = depth == len(parts) - 1
        if m is None:
            if not last or depth == 0:
                raise ValueError(f"config template: no section {'.'.join(parts[:depth + 1])!r}")
            return text[:start] + f"{indent}{name}: {value}\n" + text[start:]
        if last:
            rest = m.group(1)
            comment = rest[rest.index(" #"):] if " #" in rest else ""
            return text[:m.start(1)] + f" {value}{comment}" + text[m.end(1):]
        body = re.compile(rf"(?:{indent}[ \t]+.*\n|[ \t]*\n)*").match(text, m.end() + 1)
        start, end = body.start(), body.end()
    raise AssertionError("unreachable")


def tune(text: str) -> str:
    """The rendered config with :data:`TUNING` set."""
    for k, v in TUNING.items():
        text = _set_key(text, k, v)
    return text


def render_config(template: str, values: dict[str, object], mq: MQ) -> str:
    """The template with its ``{{ name(type): default }}`` holes filled, on ``mq`` instead of rocksmq."""

    def fill(m: re.Match) -> str:
        name, default = m.group(1), m.group(3)
        if name in values:
            v = values[name]
            return str(v).lower() if isinstance(v, bool) else str(v)
        if default is None:
            raise KeyError(f"config template value {name!r} has no default and was not given")
        return default.strip()

    text = _PLACEHOLDER.sub(fill, template)
    if "etcd_config_path" in values:  # the embedded etcd ignores etcd.endpoints: its own file sets its ports
        text, n = re.subn(r"(?m)^etcd:\n", f"etcd:\n  config:\n    path: {values['etcd_config_path']}\n", text)
        if n != 1:
            raise ValueError("config template: etcd section not found")
    if mq.type not in ("kafka", "pulsar"):
        raise ValueError(f"mq.type {mq.type!r}: kafka or pulsar")
    text, n = re.subn(r"(?m)^(mq:\n(?:\s*#.*\n)*\s+type:) rocksmq", rf"\1 {mq.type}", text)
    if n != 1:
        raise ValueError("config template: mq.type not found")
    # Every component registers 127.0.0.1 (not the machine's first interface): the server lives on loopback.
    text, n = re.subn(r"(?m)^(\s+)ip: #.*$", r"\1ip: 127.0.0.1", text)
    if n < 7:
        raise ValueError(f"config template: expected an ip key per component, found {n}")
    return _set_section(text, mq.type, mq.settings)


_LIVE: weakref.WeakSet[MilvusServer] = weakref.WeakSet()  # the servers this process started


class StartupTimeout(RuntimeError):
    """Milvus ran but did not become healthy in time."""


class MilvusServer:
    """One standalone Milvus process; ``uri`` is its gRPC address, ``etcd`` its embedded etcd's."""

    def __init__(self, mq: MQ | str, startup_timeout: float = 90.0, attempts: int = 2) -> None:
        self.mq = mq if isinstance(mq, MQ) else kafka_mq(mq)  # a str: Kafka's bootstrap servers
        self.startup_timeout = startup_timeout  # per attempt; healthy in 2-5 s on a loaded 2-core machine
        self.attempts = attempts
        self.proc: subprocess.Popen | None = None
        self.health = "not asked yet"  # the last answer of /healthz (names the component that is not healthy)
        self._fresh()

    def _fresh(self) -> None:
        self.ports = {k: free_port() for k in PORT_KEYS}
        self.metrics_port, self.peer_port = free_port(), free_port()
        self.dir = Path(tempfile.mkdtemp(prefix="milvus-real-"))

    @property
    def uri(self) -> str:
        return f"http://127.0.0.1:{self.ports['proxy_port']}"

    @property
    def etcd(self) -> str:
        return f"127.0.0.1:{self.ports['etcd_port']}"

    def start(self) -> MilvusServer:
        """Start and wait until healthy. A start that fails to come up (seen once in CI: its health server could
        not bind its port, so healthz never answered) is stopped and retried from a fresh directory on fresh
        ports, with a warning that carries the diagnosis."""
        for attempt in range(1, self.attempts + 1):
            try:
                self._start_once()
                return self
            except StartupTimeout as e:
                if attempt == self.attempts:
                    raise
                warnings.warn(f"Milvus start attempt {attempt} failed; retrying from a fresh directory: {e}",
                              stacklevel=2)
                self.stop()
                self.cleanup()
                self._fresh()
        raise AssertionError("unreachable")

    def _start_once(self) -> None:
        home = install()
        d = self.dir
        for sub in ("configs", "logs", "data"):
            (d / sub).mkdir(exist_ok=True)
        values: dict[str, object] = dict(self.ports)
        values.update(etcd_log_path=str(d / "logs" / "etcd.log"), system_log_path=str(d / "logs"),
                      etcd_data_dir=str(d / "data" / "etcd.data"), local_storage_dir=str(d / "data"),
                      rocksmq_data_dir=str(d / "data" / "rocksmq"), etcd_log_level="warn")
        peer = self.peer_port
        etcd_yaml = d / "configs" / "etcd.yaml"
        etcd_yaml.write_text("\n".join([
            "name: default", f"data-dir: {d / 'data' / 'etcd.data'}",
            f"listen-client-urls: http://127.0.0.1:{self.ports['etcd_port']}",
            f"advertise-client-urls: http://127.0.0.1:{self.ports['etcd_port']}",
            f"listen-peer-urls: http://127.0.0.1:{peer}", f"initial-advertise-peer-urls: http://127.0.0.1:{peer}",
            f"initial-cluster: default=http://127.0.0.1:{peer}", ""]))
        values["etcd_config_path"] = str(etcd_yaml)
        text = tune(render_config((home / "config.yaml.template").read_text(), values, self.mq))
        (d / "configs" / "milvus.yaml").write_text(text)
        shutil.copy(home / "glog.conf", d / "configs" / "glog.conf")
        # Only what a service needs: Milvus maps environment variables onto its config keys.
        base = {k: os.environ[k] for k in ("PATH", "HOME", "LANG", "TMPDIR", "USER") if k in os.environ}
        env = dict(base, DEPLOY_MODE="STANDALONE", METRICS_PORT=str(self.metrics_port),
                   MILVUS_RUN_DIR=str(d / "run"),
                   LD_LIBRARY_PATH=f"{home / 'bin'}:{os.environ.get('LD_LIBRARY_PATH', '')}")
        running = [s for s in _LIVE if s is not self and s.proc is not None and s.proc.poll() is None]
        if running:  # module-scoped milvus_stack: a worker's Milvus modules follow one another
            raise RuntimeError(f"another Milvus of this process still runs (pid {running[0].proc.pid}, "
                               f"{running[0].dir}): start one at a time")
        _LIVE.add(self)
        with open(d / "logs" / "stdout.log", "wb") as out:
            self.proc = subprocess.Popen([str(home / "bin" / "milvus"), "run", "standalone"], cwd=d, env=env,
                                         stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        self.wait_ready()

    def _ask_health(self, url: str) -> bool:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:
                body = resp.read()
        except urllib.error.HTTPError as e:  # 500 while a component is not healthy; its body says which
            body = e.read()
        except OSError as e:
            self.health = f"no answer ({e})"
            return False
        self.health = body.decode(errors="replace").strip()[:300]
        return body.strip() == b"OK"

    def wait_ready(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        url = f"http://127.0.0.1:{self.metrics_port}/healthz"
        while True:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"Milvus exited with {self.proc.returncode}; log:\n{self.log_tail()}")
            if self._ask_health(url):
                return
            if (clash := self._port_clash()) is not None:  # no point waiting: that server never comes up
                raise StartupTimeout(f"Milvus could not bind a port: {clash}")
            if time.monotonic() > deadline:
                raise StartupTimeout(f"Milvus not healthy within {self.startup_timeout:.0f}s (healthz: {self.health}); "
                                     f"warnings and errors:\n{self.log_problems()}\nlog:\n{self.log_tail(3000)}")
            time.sleep(0.5)  # polling a health endpoint: the wait is bounded by the deadline above

    def _port_clash(self) -> str | None:
        with contextlib.suppress(OSError):
            with open(self.dir / "logs" / "stdout.log", errors="replace") as f:
                for line in f:
                    if "address already in use" in line:
                        return line.strip()[:400]
        return None

    def log_problems(self, lines: int = 25) -> str:
        """The last WARN/ERROR lines of Milvus's stdout (a hang's cause, which the tail of GC lines hides)."""
        with contextlib.suppress(OSError):
            text = (self.dir / "logs" / "stdout.log").read_text(errors="replace")
            hits = [ln[:400] for ln in text.splitlines() if "[WARN]" in ln or "[ERROR]" in ln]
            return "\n".join(hits[-lines:]) or "(none)"
        return "(no log)"

    def log_tail(self, chars: int = 6000) -> str:
        parts = []
        for f in sorted((self.dir / "logs").glob("stdout.log")):
            with contextlib.suppress(OSError):
                text = f.read_text(errors="replace")
                crash = min((i for i in (text.find("panic:"), text.find("fatal error:"), text.find("SIGABRT"))
                             if i >= 0), default=-1)
                if crash >= 0:  # a Go crash: its first lines say why, the goroutine dump does not
                    parts.append(f"--- {f.name} (crash)\n" + text[max(0, crash - chars // 2):crash + chars // 2])
                parts.append(f"--- {f.name}\n" + text[-chars:])
        return "\n".join(parts)

    def stop(self) -> None:
        """SIGKILL, then reap (bounded). Not SIGTERM: a Milvus that did some work never ended within 5 s of it
        (measured), and its directory is removed after it anyway."""
        p = self.proc
        if p is not None and p.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p.pid, signal.SIGKILL)
            try:
                p.wait(30)
            except subprocess.TimeoutExpired as e:
                raise RuntimeError(f"Milvus (pid {p.pid}) still runs 30 s after SIGKILL") from e

    def cleanup(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
