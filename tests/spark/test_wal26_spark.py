"""Milvus 2.6 WAL topics through the Spark source end to end, on the embedded log, Kafka and Pulsar.

Few, combined tests (each Spark query costs seconds): a batch read across the 2.5 -> 2.6
upgrade boundary (rows equal to the same data written as 2.5, encrypted message, messages
columns, resume from a WALCheckpoint); a stream across transactions and an AlterCollection
with both onSchemaChange values; a driver SIGKILLed while a transaction is open.
"""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from msgstream_spark.stream.decode import wal_name
from tests.fixtures.login_env import login_env
from tests.spark import wal26_data as D
from tests.spark.helpers import spark_options
from tests.wal26 import producer as P

pytestmark = pytest.mark.slow  # Spark end to end
BACKENDS = pytest.mark.parametrize("backend", ["local", "kafka", "pulsar"], indirect=True)


def _read(spark, env, ch, **opts):
    r = spark.read.format("msgstream").options(**spark_options(env)).option("channels", ch)
    return r.options(**{k: str(v) for k, v in opts.items()}).load()


def _rows(df):
    return sorted(tuple(r) for r in df.select(*D.ROW_COLUMNS).collect())


@BACKENDS
def test_batch_read_across_the_upgrade_boundary(spark, backend):
    mixed, old = backend.new_channel("mixed"), backend.new_channel("old")
    ids = D.write_mixed(backend, mixed, encrypted=True)
    D.write_as_25(backend, old)
    with pytest.raises(Exception) as err:  # noqa: B017 - Spark wraps the task's DecodeError
        _read(spark, backend, mixed).collect()
    assert "encrypted Insert" in str(err.value) and mixed in str(err.value)
    got = _read(spark, backend, mixed, onDecodeError="skip")
    assert _rows(got) == _rows(_read(spark, backend, old))  # 2.6 rows equal the same data written as 2.5
    assert sorted((r.op, r.pk, r._ts) for r in got.collect()) == sorted(D.expected_rows())

    msgs = _read(spark, backend, mixed, output="messages", onDecodeError="skip").collect()
    assert len(msgs) == len(ids)  # version-2, DDL, control-vchannel and transaction messages: all visible
    assert sum(1 for r in msgs if r.version is None) == 2 and {r.broadcast_id for r in msgs} == {None, 77}
    assert sorted({r.txn_id for r in msgs if r.txn_id}) == [501, 502, 503]
    assert {r.vchannel for r in msgs if r.version} == {None, D.VC, P.CONTROL_VCHANNEL}

    own = D.wal_id(backend, ids[5])  # the first 2.6 insert (TT + 4): resume AT it, skip _tt <= TT + 4
    cp = base64.b64encode(P.wal_checkpoint(own, int(wal_name(backend.name)), D.TT + 4)).decode()
    resumed = _read(spark, backend, mixed, onDecodeError="skip", startingPositions=json.dumps({mixed: cp}))
    assert sorted((r.op, r.pk, r._ts) for r in resumed.collect()) == sorted(D.expected_rows()[4:])


def _stream(spark, env, ch, sub, chk, out, trigger=None, **opts):
    df = (spark.readStream.format("msgstream").options(**spark_options(env)).option("channels", ch)
          .option("subscription", sub).options(**{k: str(v) for k, v in opts.items()}).load())
    q = (df.writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(chk))
         .trigger(**(trigger or {"availableNow": True})).start())
    return q


def _run(q):
    try:
        finished = q.awaitTermination(180)
    except Exception as exc:  # noqa: BLE001 - the test looks at the failure
        return exc
    if finished is False:  # a processing-time query that did not fail within the bound
        q.stop()
        pytest.fail("the streaming query was still running after 180 s")
    return None


def _out(spark, out):
    return sorted((r.op, r.pk, r._ts) for r in spark.read.parquet(str(out)).collect())


@BACKENDS
def test_stream_across_transactions_and_an_alter_collection(spark, backend, tmp_path):
    ch, tt = backend.new_channel("stream26"), D.TT
    chk, out = tmp_path / "chk", tmp_path / "out"
    with backend.client() as c, c.create_producer(ch) as prod:
        P.write(prod, [P.create_collection(tt), P.insert(tt + 1, [1, 2]), P.timetick(tt + 2),
                       *P.upsert_txn(tt + 3, 31, [1], end="open"), P.timetick(tt + 6)])
        assert _run(_stream(spark, backend, ch, "s26", chk, out, maxRowsPerTrigger=1)) is None
        assert _out(spark, out) == [("insert", 1, tt + 1), ("insert", 2, tt + 1)]  # the open txn waits
        P.write(prod, [P.commit_txn(tt + 7, 31), *P.upsert_txn(tt + 8, 32, [2], end="rollback"), P.timetick(tt + 12)])
        assert _run(_stream(spark, backend, ch, "s26", chk, out, maxRowsPerTrigger=1)) is None
        want = [("delete", 1, tt + 7), ("insert", 1, tt + 1), ("insert", 1, tt + 7), ("insert", 2, tt + 1)]
        assert _out(spark, out) == want  # committed once, at the commit's time; the rolled back one never
        running = _stream(spark, backend, ch, "s26", chk, out, {"processingTime": "200 milliseconds"})
        P.write(prod, [P.alter_collection(tt + 13, "note"), P.insert(tt + 14, [3]), P.timetick(tt + 15)])
        err = _run(running)  # the running query's inferred schema has no field note: onSchemaChange=fail
    assert err is not None and "adds field(s) note" in str(err) and f"collection c26 (id {P.COLLECTION})" in str(err)
    assert ch in str(err) and "_tt" in str(err)
    # a query keeping its schema (given here, as a restart would re-infer it) drops the new field
    assert _run(_stream(spark, backend, ch, "s26", chk, out, onSchemaChange="ignore",
                        schema="pk bigint, vec array<float>")) is None
    assert _out(spark, out) == sorted([*want, ("insert", 3, tt + 14)])  # each row exactly once
    assert "note" in _read(spark, backend, ch).columns  # a new query infers the altered schema


def test_driver_killed_while_a_transaction_is_open_gives_its_rows_exactly_once(spark, local_env, tmp_path):
    env, ch, tt = local_env, local_env.new_channel("kill26"), D.TT
    chk, out = tmp_path / "chk", tmp_path / "out"
    with env.client() as c, c.create_producer(ch) as prod:
        before = [P.create_collection(tt)]
        for i in range(3):  # three aligned batches of 10 rows before the transaction
            before += [P.insert(tt + 10 * i + 1, list(range(10 * i, 10 * i + 10))), P.timetick(tt + 10 * i + 2)]
        txn = P.upsert_txn(tt + 100, 41, list(range(30, 55)), end="open")  # 25 deletes + 25 inserts
        P.write(prod, [*before, *txn, P.timetick(tt + 110)])
        proc = subprocess.Popen([sys.executable, "-m", "tests.spark.killed_query", json.dumps(spark_options(env)),
                                 ch, str(chk), str(out)], cwd=Path(__file__).parents[2],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                                env=login_env())
        try:
            deadline, commits = time.monotonic() + 180, chk / "commits"
            while time.monotonic() < deadline:  # bounded: the query commits a batch before the transaction
                if commits.is_dir() and any(p.name.isdigit() for p in commits.iterdir()):
                    break
                assert proc.poll() is None, "the query process died on its own"
                time.sleep(0.2)
            else:
                pytest.fail("the query made no progress within 180 s")
            os.killpg(proc.pid, signal.SIGKILL)  # the transaction is still open
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(30)
        P.write(prod, [P.commit_txn(tt + 111, 41), P.insert(tt + 112, [99]), P.timetick(tt + 113)])
    q = (spark.readStream.format("msgstream").options(**spark_options(env)).option("channels", ch)
         .option("subscription", "killed").option("maxRowsPerTrigger", "10").load()
         .writeStream.format("parquet").option("path", str(out)).option("checkpointLocation", str(chk))
         .trigger(availableNow=True).start())
    assert _run(q) is None
    got = sorted((r.op, r.pk) for r in spark.read.parquet(str(out)).collect())
    want = sorted([("insert", p) for p in range(55)] + [("delete", p) for p in range(30, 55)] + [("insert", 99)])
    assert got == want  # the transaction's 50 rows exactly once, though they exceed maxRowsPerTrigger


def test_batch_read_of_a_26_channel_through_a_milvus_proxy(spark, milvus_proxy, tmp_path):
    """``mq.type=milvus`` (DumpMessages of the suite's proxy): the same 2.6 rows as from the broker."""
    import yaml

    from msgstream_spark.config import Config
    from tests.fixtures.backend_env import BackendEnv

    store = BackendEnv("local", Config.from_dict({"mq": {"type": "local"}, "local": {"path": milvus_proxy.store_path}}))
    ch = store.new_channel("proxy26")
    D.write_mixed(store, ch)  # the proxy hands out the store's entries as RocksMQ WAL ids
    conf = tmp_path / "milvus.yaml"
    conf.write_text(yaml.safe_dump({"mq": {"type": "milvus"}, "milvus": {
        "address": milvus_proxy.address, "metadataPath": str(tmp_path / "meta.json"), "requestTimeout": 10}}))
    df = spark.read.format("msgstream").option("config", str(conf)).option("channels", ch).load()
    assert sorted((r.op, r.pk, r._ts) for r in df.collect()) == sorted(D.expected_rows())
    direct = (spark.read.format("msgstream").option("mq.type", "local").option("local.path", milvus_proxy.store_path)
              .option("channels", ch).load())

    def positions(frame):  # the 2.6 rows (a Milvus proxy serves only the 2.6 WAL; the 2.5 rows keep its ids)
        rows = frame.select("op", "pk", "_ts", "_position").collect()
        return sorted((r.op, r.pk, r._ts, r._position) for r in rows if r._ts >= D.TT)

    assert len(positions(df)) == 6
    assert positions(df) == positions(direct)  # Milvus's own positions (legacy bytes of _lc), either way


def test_the_sinks_2_6_transactional_output_reads_back_like_its_2_5_output(spark, local_env, tmp_path):
    """wireFormat=2.6 (transactions, driver ticks) and 2.5 writes of one DataFrame give the source equal rows."""
    from tests.sink.helpers import config_file
    from tests.sink.test_sink_spark import FIELD_TYPES, _types_df

    df = _types_df(spark).repartition(2)
    conf = config_file(local_env, tmp_path)
    chans = {}
    for wire in ("2.5", "2.6"):
        chans[wire] = [local_env.new_channel(f"sink{wire[-1]}") for _ in range(2)]
        (df.write.format("msgstream").option("config", conf).option("channels", ",".join(chans[wire]))
         .option("collection", "types").option("collectionID", "449").option("fieldTypes", FIELD_TYPES)
         .option("wireFormat", wire).option("transactional", str(wire == "2.6").lower()).mode("append").save())

    def back(wire):
        got = (spark.read.format("msgstream").option("config", conf).option("channels", ",".join(chans[wire]))
               .load().select("op", "pk", "s", "i64", "vec", "_collection").collect())
        return sorted(tuple(r) for r in got)

    assert back("2.6") == back("2.5") and len(back("2.6")) == df.count()
