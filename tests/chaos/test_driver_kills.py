"""Faults 1 and 2: the streaming driver SIGKILLed at seeded random moments while producers keep
writing, restarted from its checkpoint each time; every row exactly once at the end. On the embedded log
(``make test``'s size) this is also the streaming source's driver-kill test (docs/testing.md, "Moves")."""

from __future__ import annotations

import signal
import time

import pytest

from tests.chaos.driver import start_query
from tests.chaos.harness import Driver, Producers, commits, wait_for
from tests.chaos.knobs import Figures, rng, size
from tests.fixtures.waits import finish
from tests.sink.helpers import deleted_keys, inserted_rows, read_channel
from tests.spark.helpers import spark_options

START_S = 300  # bound on a driver (re)start reaching its first new commit on a loaded machine


def _kill_loop(fault: str, spark, spec: dict, chk, tmp_path, kills: int, fig: Figures, prod: Producers) -> None:
    """Start the driver, let it commit, SIGKILL it at a random moment; ``kills`` times, each (re)start a driver
    process of its own. Then the drain, with the producers stopped: the query restarted from the checkpoint with
    an AvailableNow trigger in the test's own session (a JVM that never ran this query: all it inherits from the
    killed driver is the checkpoint, the output and the broker's metadata), recovering and reading everything.
    ``recovery_s`` is each killed driver's next process reaching a new commit (a JVM start included); the drain's
    own is ``extra["drain_recovery_s"]`` (a warm session's)."""
    rnd, t_kill = rng(fault), 0.0
    for i in range(kills):
        d = Driver(spec, tmp_path, f"{fault}-{i}").start()
        base = commits(chk)
        wait_for(lambda base=base: commits(chk) > base, START_S, f"{fault}: a commit after (re)start {i}", d.alive)
        if i > 0:
            fig.recovery_s.append(round(time.monotonic() - t_kill, 2))
        delay = rnd.uniform(0.0, 4.0)
        print(f"[chaos] {fault}: kill {i + 1}/{kills} {delay:.2f}s after commit {commits(chk)}", flush=True)
        time.sleep(delay)  # the random moment of the kill, not a synchronisation
        t_kill = time.monotonic()
        d.kill()
        assert d.proc.returncode == -signal.SIGKILL, f"{fault}: driver {i} was not alive when killed: {d.tail()}"
        fig.injected += 1
    _stop_producers(prod)
    q = start_query(spark, dict(spec, trigger="available"))
    base = commits(chk)

    def alive() -> None:
        if not q.isActive and q.exception() is not None:
            raise AssertionError(f"{fault}: the drain failed: {q.exception()}")

    wait_for(lambda: commits(chk) > base or not q.isActive, START_S, f"{fault}: a commit of the drain", alive)
    fig.extra["drain_recovery_s"] = round(time.monotonic() - t_kill, 2)
    finish(q, START_S, f"{fault}: the drain (AvailableNow from the checkpoint)")


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
        _kill_loop(f"driver-kill-read-{backend_name}", spark, spec, chk, tmp_path, size()["kills"], fig, prod)
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
        _kill_loop("driver-kill-write", spark, spec, chk, tmp_path, size()["kills"], fig, prod)
    finally:
        prod.stop()
    rows = (spark.read.format("msgstream").options(**spark_options(env)).option("channels", ",".join(dst))
            .option("dedupe", "true").option("schema", "op string, pk bigint, vec array<float>, name string")
            .load().collect())
    got = [r.pk for r in rows if r.op == "insert"]
    fig.count(prod.inserted, got)
    with env.client() as c:  # a figure, not asserted: the rows the sink wrote, replays included
        reads = [r for ch in dst for r in read_channel(c, ch)]
    fig.extra["rows_written_incl_replays"] = len(inserted_rows(reads)) + len(deleted_keys(reads))
    fig.save()
    assert (fig.rows_lost, fig.rows_duplicated, fig.extra["rows_unexpected"]) == (0, 0, 0)
