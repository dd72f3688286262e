"""Fault 6: a streaming query under continuous producers (1 minute in `make test`, 10 with `make chaos`):
memory slope of the driver and its workers, lag, and every row exactly once."""

from __future__ import annotations

import json
import re
import time

import psutil
import pytest

from tests.chaos.harness import Driver, Producers, wait_for
from tests.chaos.knobs import Figures, size
from tests.spark.helpers import spark_options

SAMPLE_S = 5


def _rss_mb(driver_pid: int) -> dict[str, float]:
    """RSS of the driver's Python process, its JVM, and the largest of its Python workers (daemons and
    forks), in MB. Workers are judged one by one: Spark forks and retires them as it likes, so their
    sum moves with their number (a fork during the last half of a 1-minute soak read as +1 GB/min)."""
    out = {"driver": 0.0, "jvm": 0.0, "workers": 0.0}
    try:
        root = psutil.Process(driver_pid)
        out["driver"] = root.memory_info().rss / 2**20
        for p in root.children(recursive=True):
            mb = p.memory_info().rss / 2**20
            if "java" in p.name():
                out["jvm"] += mb
            else:
                out["workers"] = max(out["workers"], mb)
    except psutil.Error:
        pass
    return out


def slope_mb_per_min(samples: list[tuple[float, float]]) -> float:
    """Least-squares slope of (seconds, MB) samples, in MB per minute."""
    n = len(samples)
    if n < 2:
        return 0.0
    mt = sum(t for t, _ in samples) / n
    mv = sum(v for _, v in samples) / n
    den = sum((t - mt) ** 2 for t, _ in samples) or 1.0
    return 60 * sum((t - mt) * (v - mv) for t, v in samples) / den


def _processed(d: Driver) -> int:
    lines = re.findall(r"\[progress\] (\{.*\})", d.tail(1_000_000))
    return json.loads(lines[-1])["rows"] if lines else 0


@pytest.mark.slow
def test_soak_memory_flat_lag_bounded_rows_exact(spark, local_env, tmp_path):
    env, soak_s = local_env, size()["soak_s"]
    channels = [env.new_channel("soak"), env.new_channel("soak")]
    chk, out = tmp_path / "chk", tmp_path / "out"
    spec = {"mode": "read", "out": str(out), "chk": str(chk), "max_rows": 20000,
            "options": {**spark_options(env), "channels": ",".join(channels), "subscription": "soak",
                        "startingPositions": "earliest"}}
    prod = Producers(env, channels, rows=20, pause=0.2).start()
    wait_for(lambda: prod.rounds >= 1, 60, "the producers' first round")
    d = Driver(spec, tmp_path, "soak").start()
    fig = Figures("soak", "local")
    mem: dict[str, list] = {"driver": [], "jvm": [], "workers": []}
    lags: list[int] = []
    try:
        wait_for(lambda: "[progress]" in d.tail(100_000), 300, "the soak query's first batch", d.alive)
        t0 = time.monotonic()
        while time.monotonic() - t0 < soak_s:
            d.alive()
            t = time.monotonic() - t0
            for k, v in _rss_mb(d.proc.pid).items():
                mem[k].append((t, v))
            lags.append(len(prod.inserted) - _processed(d))
            time.sleep(SAMPLE_S)  # the sampling period of the soak's figures
        prod.stop()
        t_stop = time.monotonic()
        wait_for(lambda: _processed(d) >= len(prod.inserted), 300, "the soak query to catch up", d.alive, poll=1)
        fig.recovery_s.append(round(time.monotonic() - t_stop, 2))  # drain time after the producers stop
    finally:
        prod.stop()
        d.kill()
    fig.count(prod.inserted, [r.pk for r in spark.read.parquet(str(out)).select("pk").collect()])
    half = {k: [s for s in v if s[0] >= soak_s / 2] for k, v in mem.items()}
    fig.extra.update(soak_s=soak_s, rows_per_s=round(len(prod.inserted) / soak_s, 1), lag_rows_max=max(lags),
                     lag_rows_last=lags[-1], **{f"{k}_rss_mb_last": round(v[-1][1], 1) for k, v in mem.items() if v},
                     **{f"{k}_slope_mb_per_min": round(slope_mb_per_min(v), 2) for k, v in half.items()})
    fig.save()
    assert (fig.rows_lost, fig.rows_duplicated, fig.extra["rows_unexpected"]) == (0, 0, 0)
    # lag bounded: never more than 60 s of production behind
    assert fig.extra["lag_rows_max"] <= 60 * max(fig.extra["rows_per_s"], 1), fig.extra
    # the Python sides do not grow (the JVM's heap is reported, not judged: it grows until it collects)
    assert fig.extra["driver_slope_mb_per_min"] < 20 and fig.extra["workers_slope_mb_per_min"] < 50, fig.extra
