"""Faults 1 and 2: the streaming driver SIGKILLed at seeded random moments while producers keep
writing, restarted from its checkpoint each time; every row exactly once at the end. On the embedded log
(``make test``'s size) this is also the streaming source's driver-kill test (docs/testing.md, "Moves")."""

from __future__ import annotations

import time

import pytest

from tests.chaos.harness import Driver, Producers, commits, wait_for
from tests.chaos.knobs import Figures, rng, size
from tests.spark.helpers import spark_options

START_S = 300  # bound on a driver (re)start reaching its first new commit on a loaded machine


def _kill_loop(fault: str, spec: dict, chk, tmp_path, kills: int, fig: Figures, prod: Producers) -> None:
    """Start the driver, let it commit, SIGKILL it at a random moment; ``kills`` times. The last restart
    runs with the producers stopped and an AvailableNow trigger: it recovers and drains everything."""
    rnd = rng(fault)
    t_kill = None
    for i in range(kills + 1):
        last = i == kills
        if last:
            _stop_producers(prod)
        d = Driver(dict(spec, trigger="available") if last else spec, tmp_path, f"{fault}-{i}").start()
        base = commits(chk)
        wait_for(lambda base=base, last=last, d=d: commits(chk) > base or (last and d.proc.poll() == 0), START_S,
                 f"{fault}: a commit after (re)start {i}", d.alive if not last else None)
        if t_kill is not None:
            fig.recovery_s.append(round(time.monotonic() - t_kill, 2))
        if last:
            assert d.wait(START_S) == 0, d.tail()
            return
        delay = rnd.uniform(0.0, 4.0)
        print(f"[chaos] {fault}: kill {i + 1}/{kills} {delay:.2f}s after commit {commits(chk)}", flush=True)
        time.sleep(delay)  # the random moment of the kill, not a synchronisation
        t_kill = time.monotonic()
        d.kill()
        fig.injected += 1


def _stop_producers(prod: Producers) -> None:
    prod.stop()
    assert not prod.errors, prod.errors[:3]


@pytest.mark.slow
@pytest.mark.parametrize("backend_name", ["local", "kafka", "pulsar-lite"])
def test_streaming_read_driver_killed_repeatedly_loses_and_duplicates_nothing(spark, request, backend_name,
                                                                              tmp_path):
    if backend_name not in size()["backends"]:
        pytest.skip(f"{backend_name}: not in this size's backends (MSGSTREAM_CHAOS_SIZE=medium or large runs it)")
    env = request.getfixturevalue(f"{backend_name.replace('-', '_')}_env")
    channels = [env.new_channel("kill"), env.new_channel("kill")]
    chk, out = tmp_path / "chk", tmp_path / "out"
    prod = Producers(env, channels, pause=0.2).start()
    wait_for(lambda: prod.rounds >= 2, 60, "the producers' first rounds")
    spec = {"mode": "read", "out": str(out), "chk": str(chk), "max_rows": 5000,
            "options": {**spark_options(env), "channels": ",".join(channels), "subscription": "chaos",
                        "startingPositions": "earliest"}}
    fig = Figures("driver-kill-read", backend_name)
    try:
        _kill_loop(f"driver-kill-read-{backend_name}", spec, chk, tmp_path, size()["kills"], fig, prod)
    finally:
        prod.stop()
    got = [r.pk for r in spark.read.parquet(str(out)).select("pk").collect()]
    fig.count(prod.inserted, got)
    fig.extra["commits"] = commits(chk)
    fig.save()
    assert (fig.rows_lost, fig.rows_duplicated, fig.extra["rows_unexpected"]) == (0, 0, 0)


@pytest.mark.slow
def test_streaming_write_with_stable_writer_id_killed_repeatedly_gives_each_row_once(spark, local_env, tmp_path):
    env = local_env
    src, dst = [env.new_channel("src"), env.new_channel("src")], [env.new_channel("dst"), env.new_channel("dst")]
    chk = tmp_path / "chk"
    prod = Producers(env, src, pause=0.2).start()
    wait_for(lambda: prod.rounds >= 2, 60, "the producers' first rounds")
    spec = {"mode": "write", "chk": str(chk), "max_rows": 5000,
            "options": {**spark_options(env), "channels": ",".join(src), "subscription": "chaos-w",
                        "startingPositions": "earliest"},
            "sink_options": {**spark_options(env), "channels": ",".join(dst), "writerId": "chaos-writer",
                             "collection": "chaos", "primaryKey": "pk"}}
    fig = Figures("driver-kill-write", "local")
    try:
        _kill_loop("driver-kill-write", spec, chk, tmp_path, size()["kills"], fig, prod)
    finally:
        prod.stop()
    rows = (spark.read.format("msgstream").options(**spark_options(env)).option("channels", ",".join(dst))
            .option("dedupe", "true").option("schema", "op string, pk bigint, vec array<float>, name string")
            .load().collect())
    got = [r.pk for r in rows if r.op == "insert"]
    fig.count(prod.inserted, got)
    raw = (spark.read.format("msgstream").options(**spark_options(env)).option("channels", ",".join(dst))
           .option("schema", "pk bigint").load().count())
    fig.extra["rows_written_incl_replays"] = raw
    fig.save()
    assert (fig.rows_lost, fig.rows_duplicated, fig.extra["rows_unexpected"]) == (0, 0, 0)
