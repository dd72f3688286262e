"""Fault 4: brokers restarted mid-stream, the embedded log locked by another process and its disk full."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import time

import pytest

from msgstream_spark.config import Config
from msgstream_spark.mq.base import ProducerMessage
from msgstream_spark.mq.registry import build_client
from tests.chaos.driver import start_query
from tests.chaos.harness import Producers, commits, wait_for
from tests.chaos.knobs import Figures, rng, size
from tests.fixtures.backend_env import BackendEnv
from tests.fixtures.kafka_env import kafka_config
from tests.fixtures.pulsar_env import pulsar_config
from tests.fixtures.waits import finish, wait_until
from tests.spark.helpers import Publisher, spark_options

START_S = 300


@pytest.mark.slow
def test_pulsar_lite_restarted_mid_stream_the_query_continues_and_loses_nothing(spark, pulsar_lite_broker, tmp_path):
    b = pulsar_lite_broker
    env = BackendEnv("pulsar", pulsar_config(b.url, b.web_port, requestTimeout=30))
    rnd = rng("pulsar-lite-restart")
    channels = [env.new_channel("pl"), env.new_channel("pl")]
    chk, out = tmp_path / "chk", tmp_path / "out"
    prod = Producers(env, channels, pause=0.2).start()
    spec = {"mode": "read", "out": str(out), "chk": str(chk), "max_rows": 5000,
            "options": {**spark_options(env), "channels": ",".join(channels), "subscription": "chaos",
                        "startingPositions": "earliest"}}
    # The query runs in the test's own session (the broker is what is killed, not the driver): the chaos driver's
    # query, started once, must go through every restart.
    q = start_query(spark, spec)
    fig = Figures("broker-restart", "pulsar-lite")

    def alive() -> None:
        if not q.isActive:
            raise AssertionError(f"the query ended: {q.exception()}")

    try:
        wait_for(lambda: commits(chk) >= 1, START_S, "the first commit", alive)
        for i in range(size()["restarts"]):
            delay = rnd.uniform(0.0, 3.0)
            print(f"[chaos] pulsar-lite-restart: SIGKILL+restart {i + 1} {delay:.2f}s after commit {commits(chk)}",
                  flush=True)
            time.sleep(delay)  # the random moment, not a synchronisation
            t0 = time.monotonic()
            old = b.proc
            b.restart(signal.SIGKILL)
            assert old.returncode == -signal.SIGKILL and b.proc is not old, "the broker was not killed and restarted"
            fig.injected += 1
            base = commits(chk)
            wait_for(lambda base=base: commits(chk) > base, START_S, f"a commit after restart {i + 1}", alive)
            fig.recovery_s.append(round(time.monotonic() - t0, 2))
        prod.stop()
        want = len(prod.inserted)

        def caught_up() -> bool:
            return spark.read.parquet(str(out)).count() >= want

        wait_for(caught_up, START_S, "the query to catch up with the producers", alive, poll=1)
        alive()  # the same query went through every restart
    finally:
        prod.stop()
        q.stop()
    fig.count(prod.inserted, [r.pk for r in spark.read.parquet(str(out)).select("pk").collect()])
    fig.extra["producer_send_errors"] = len(prod.errors)  # sends retried while the broker was down
    fig.save()
    assert (fig.rows_lost, fig.rows_duplicated) == (0, 0)


def _stream_once(spark, env, channel, chk, out, **opts):
    q = (spark.readStream.format("msgstream").options(**spark_options(env)).option("channels", channel)
         .option("subscription", "tansu").option("startingPositions", "earliest")
         .options(**{k: str(v) for k, v in opts.items()}).load()
         .writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(chk))
         .trigger(availableNow=True).start())
    finish(q, START_S, "the availableNow run on tansu")
    return q


@pytest.mark.slow
def test_tansu_restarted_loses_its_data_fail_on_data_loss_names_channel_and_position(spark, kafka_broker, tmp_path):
    env = BackendEnv("kafka", kafka_config(kafka_broker.bootstrap))
    ch = env.new_channel("tansu")
    chk, out = tmp_path / "chk", tmp_path / "out"
    client = env.client()
    pub = Publisher(client, [ch])
    pub.rounds(5)
    pub.close()
    client.close()
    _stream_once(spark, env, ch, chk, out)
    assert spark.read.parquet(str(out)).count() == 50
    fig = Figures("broker-restart", "tansu", injected=1)
    t0 = time.monotonic()
    kafka_broker.kill()  # memory only: everything it held is gone
    kafka_broker.start()
    client = env.client()
    pub2 = Publisher(client, [ch], ts=pub.ts, next_pk=1000)
    pub2.rounds(2)
    pub2.close()
    client.close()
    with pytest.raises(Exception) as ei:
        _stream_once(spark, env, ch, chk, out)
    text = str(ei.value)
    assert ch in text and "failOnDataLoss" in text, text[-2000:]
    rows_before = spark.read.parquet(str(out)).count()
    _stream_once(spark, env, ch, chk, out, failOnDataLoss="false")
    fig.recovery_s.append(round(time.monotonic() - t0, 2))
    got = [r.pk for r in spark.read.parquet(str(out)).select("pk").collect()]
    fig.count(list(range(50)) + list(range(1000, 1020)), got)
    fig.extra.update(rows_after_loss=len(got) - rows_before, note="the broker's data is gone: lost = what tansu "
                     "dropped and nothing more")
    fig.save()
    assert sorted(got) == list(range(50)) + list(range(1000, 1020))  # continues with what the new broker has


HOLD_LOCK = """
import sqlite3, sys, time
c = sqlite3.connect(sys.argv[1], isolation_level=None)
c.execute("BEGIN EXCLUSIVE")
print("locked", flush=True)
sys.stdin.read()
"""


def _count(cfg: Config, ch: str) -> int:
    with build_client("local", cfg) as c:
        if c.latest_message_id(ch) is None:
            return 0
        r = c.reader(ch)
        r.seek(c.earliest_message_id(), inclusive=True)
        n = 0
        while batch := r.receive_batch(1000, 1.0):
            n += len(batch)
        r.close()
        return n


def _running_tasks(spark) -> int:
    """Tasks running on the session's executors (the driver's in local mode), from Spark's status tracker."""
    return sum(e.numRunningTasks() for e in spark.sparkContext._jsc.sc().statusTracker().getExecutorInfos())


@pytest.mark.slow
def test_local_log_locked_past_busy_timeout_is_a_clear_error_naming_the_file(spark, tmp_path):
    db = tmp_path / "log.db"
    cfg = Config.from_dict({"mq": {"type": "local"}, "local": {"path": str(db), "busyTimeout": 1}})
    env = BackendEnv("local", cfg)
    ch = env.new_channel("locked")
    with build_client("local", cfg) as c, c.create_producer(ch) as p:
        p.send(ProducerMessage(b"x", {"msg_type": "TimeTick"}))  # the file and channel exist
    holder = subprocess.Popen([sys.executable, "-c", HOLD_LOCK, str(db)], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True)
    fig = Figures("local-lock", "local", injected=1)
    try:
        assert holder.stdout.readline().strip() == "locked"
        df = spark.createDataFrame([(i, [float(i)] * 4) for i in range(100)], "pk long, vec array<float>")
        with pytest.raises(Exception) as ei:
            df.write.format("msgstream").options(**spark_options(env)).option("channels", ch).mode("append").save()
        text = str(ei.value)
        # the job fails at its first failed task; its other task, cancelled, may still run until Spark kills its
        # Python worker: the lock stays held until no task runs (what it would write after is not this fault)
        wait_until(lambda: _running_tasks(spark) == 0, 60, "the failed write's cancelled tasks to end",
                   seen=lambda: _running_tasks(spark))
    finally:
        holder.stdin.close()
        holder.wait(30)
    assert str(db) in text and ("write lock" in text or "database is locked" in text), text[-2000:]
    fig.count([], [])
    fig.extra["messages_after"] = _count(cfg, ch)
    fig.save()
    assert fig.extra["messages_after"] == 1  # nothing half-written


FILL_DISK = """
import json, resource, signal, sys
from msgstream_spark.config import Config
from msgstream_spark.mq.base import ProducerMessage
from msgstream_spark.mq.registry import build_client
cfg = Config.from_dict({"mq": {"type": "local"}, "local": {"path": sys.argv[1], "mmapSizeMB": 0}})
client = build_client("local", cfg)
p = client.create_producer(sys.argv[2])
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG instead
resource.setrlimit(resource.RLIMIT_FSIZE, (int(sys.argv[3]), int(sys.argv[3])))
acked = 0
try:
    for i in range(100000):
        p.send_batch([ProducerMessage(b"%08d" % (i * 10 + k) + b"." * 2000) for k in range(10)])
        acked += 10
except Exception as exc:
    print(json.dumps({"acked": acked, "type": type(exc).__name__, "error": str(exc)}), flush=True)
    sys.exit(0)
print(json.dumps({"acked": acked, "error": None}), flush=True)
"""


@pytest.mark.slow
def test_local_log_disk_full_is_a_clear_error_and_keeps_what_was_acknowledged(tmp_path):
    db = tmp_path / "log.db"
    ch = "full-dml_0"
    r = subprocess.run([sys.executable, "-c", FILL_DISK, str(db), ch, str(2 * 2**20)], capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(r.stdout.strip().splitlines()[-1])
    fig = Figures("local-disk-full", "local", injected=1)
    assert res["error"] is not None, "the size limit was never reached"
    assert res["type"] == "ProduceError" and ch in res["error"] and str(db) in res["error"], res
    cfg = Config.from_dict({"mq": {"type": "local"}, "local": {"path": str(db)}})
    with build_client("local", cfg) as c:  # still readable, everything acknowledged is there, once
        rd = c.reader(ch)
        rd.seek(c.earliest_message_id(), inclusive=True)
        got = []
        while batch := rd.receive_batch(1000, 1.0):
            got += [int(m.payload[:8]) for m in batch]
        rd.close()
    fig.count(list(range(res["acked"])), got)
    fig.extra["error"] = res["error"][:200]
    fig.save()
    assert got == list(range(res["acked"]))
