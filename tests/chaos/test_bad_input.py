"""Fault 5: corrupt Milvus payloads (300 at `make test`'s size, 1,000 in `make chaos`) interleaved with valid ones,
through Spark and the CLI."""

from __future__ import annotations

import base64
import subprocess
import sys
import threading
import time
from pathlib import Path

import psutil
import pytest

from msgstream_spark.cli.main import main as cli_main
from msgstream_spark.mq.base import ProducerMessage
from msgstream_spark.msg import codec
from msgstream_spark.msg.position import MsgPosition
from tests.chaos.badinput import KINDS, Generator, insert_msg
from tests.chaos.knobs import Figures, rng, size
from tests.fixtures.login_env import login_env
from tests.spark.helpers import spark_options

VALID_EVERY = 10  # one valid insert after every 10 bad payloads
ROWS = 5


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The embedded log with the bad payloads interleaved with valid inserts; what was written where."""
    from msgstream_spark.config import Config
    from msgstream_spark.mq.registry import build_client

    d = tmp_path_factory.mktemp("badinput")
    cfg = Config.from_dict({"mq": {"type": "local"}, "local": {"path": str(d / "log.db")}})
    seed = rng("bad-input").randrange(1 << 30)
    bad = Generator(seed).batch(size()["bad"])
    ch, valid, bad_ids, pk, ts = "bad-input-dml_0", [], [], 0, 1 << 40
    with build_client("local", cfg) as client, client.create_producer(ch) as p:
        for i, b in enumerate(bad):
            if i % VALID_EVERY == 0:
                ts += 1
                p.send(ProducerMessage(*codec.marshal(insert_msg(pk, ROWS, ts=ts, msg_id=ts))))
                valid += [(q, tuple(q * 10.0 + k for k in range(4)), f"n{q}") for q in range(pk, pk + ROWS)]
                pk += ROWS
            bad_ids.append(p.send(ProducerMessage(b.payload, b.properties)).serialize())
    (d / "msgstream.yaml").write_text(f"mq:\n  type: local\nlocal:\n  path: {d / 'log.db'}\n")
    return dict(cfg=cfg, channel=ch, bad=bad, bad_ids=bad_ids, valid=valid, dir=d)


class _Peak:
    """Peak RSS of the Spark JVM's Python workers, sampled while a read runs."""

    def __init__(self) -> None:
        self.peak, self._stop = 0, threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.wait(0.1):
            try:
                procs = [c for c in me.children(recursive=True) if "python" in c.name().lower()]
                self.peak = max([self.peak] + [c.memory_info().rss for c in procs])
            except psutil.Error:
                pass

    def __enter__(self) -> _Peak:
        self._t.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._t.join(5)


@pytest.mark.slow
def test_spark_fail_names_the_first_bad_message_and_skip_yields_exactly_the_valid_rows(spark, corpus):
    from tests.fixtures.backend_env import BackendEnv

    env = BackendEnv("local", corpus["cfg"])
    base = (spark.read.format("msgstream").options(**spark_options(env)).option("channels", corpus["channel"])
            .option("schema", "pk bigint, vec array<float>, name string"))
    fig = Figures("bad-input", "local", injected=len(corpus["bad"]))
    t0 = time.monotonic()
    with pytest.raises(Exception) as ei:
        base.load().collect()
    fig.extra["fail_s"] = round(time.monotonic() - t0, 2)
    text = str(ei.value)
    first = corpus["bad_ids"][0]
    assert corpus["channel"] in text and f"msgID(base64)={base64.b64encode(first).decode()}" in text, text[-2000:]
    assert "payload(" in text and "onDecodeError=skip" in text
    t0 = time.monotonic()
    with _Peak() as peak:
        rows = base.option("onDecodeError", "skip").load().collect()
    fig.recovery_s.append(round(time.monotonic() - t0, 2))
    fig.extra["worker_peak_rss_mb"] = round(peak.peak / 2**20, 1)
    got = [(r.pk, tuple(r.vec), r.name) for r in rows]
    fig.count(corpus["valid"], got)
    fig.save()
    assert sorted(got) == sorted(corpus["valid"])
    assert fig.extra["worker_peak_rss_mb"] < 1024


def _cli(argv: list[str], capsys) -> tuple[int, list[str], str]:
    code = cli_main(argv)
    out, err = capsys.readouterr()
    return code, [ln for ln in err.splitlines() if ln.strip()], out


@pytest.mark.slow  # part of the chaos suite (300-1,000 payloads through the CLI, two commands each)
def test_inspect_and_tail_give_one_error_line_per_bad_payload(corpus, capsys):
    cfg = str(corpus["dir"] / "msgstream.yaml")
    fig = Figures("bad-input-cli", "local", injected=2 * len(corpus["bad"]))
    bad_lines = []
    for b, mid in zip(corpus["bad"], corpus["bad_ids"]):
        b64 = base64.b64encode(b.payload).decode()
        code, err, out = _cli(["inspect", "--base64", b64, "--msg-type", b.properties["msg_type"]], capsys)
        if code != 1 or len(err) != 1 or not err[0].startswith("msgstream inspect: error: ") or out:
            bad_lines.append(("inspect", b.kind, code, err, out[:200]))
        pos = MsgPosition(corpus["channel"], mid, "", 0).to_base64()
        code, err, out = _cli(["tail", "--config", cfg, "-c", corpus["channel"], "--from", pos, "-n", "1",
                               "--timeout", "5"], capsys)
        if (code != 1 or len(err) != 1 or not err[0].startswith("msgstream tail: error: ")
                or corpus["channel"] not in err[0] or base64.b64encode(mid).decode() not in err[0] or out):
            bad_lines.append(("tail", b.kind, code, err, out[:200]))
    fig.extra["wrong_outputs"] = len(bad_lines)
    fig.save()
    assert not bad_lines, bad_lines[:5]


@pytest.mark.slow
def test_the_console_script_exits_1_with_one_line(corpus):
    """The installed ``msgstream`` script, as users run it, once per kind (the rest ran in-process)."""
    exe = Path(sys.executable).with_name("msgstream")
    seen = set()
    for b in corpus["bad"]:
        if b.kind in seen:
            continue
        seen.add(b.kind)
        r = subprocess.run([str(exe), "inspect", "--base64", base64.b64encode(b.payload).decode(), "--msg-type",
                            b.properties["msg_type"]], capture_output=True, text=True, timeout=60, cwd="/",
                           env=login_env())
        lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
        assert r.returncode == 1 and len(lines) == 1 and lines[0].startswith("msgstream inspect: error:"), \
            (b.kind, r.returncode, r.stderr[-1000:])
    assert seen == set(KINDS)
