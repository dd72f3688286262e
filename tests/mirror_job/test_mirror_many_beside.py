"""Snapshots beside the stream (``mirror run --database ... --snapshot initial``): a collection's snapshot runs while
the query streams the other tables; the batches stage its rows; the first batch after its snapshot committed
(or the query's end) hands them over with the snapshot's S (docs/mirror.md "Snapshots while streaming").

The snapshot is held, in the suite's Milvus proxy (its ``on_query`` hook, the snapshot's first Query: after its
positions and S were taken), until the test sees what must happen meanwhile: another table taking a batch, the
pending collection's batches staged. Each table must equal the rows the test wrote (ManyLog's ``expected``, read
by delta-rs), none twice, no batch recorded twice. The killed runs are subprocesses (SIGKILLed at a failpoint);
their restarts run in the suite's Spark session.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import deltalake
import pytest
import yaml

from tests.fixtures.waits import wait_until
from tests.mirror_job.many_log import ManyLog, listed_collections, two_pending
from tests.mirror_job.test_mirror_many import batches_committed, table_rows
from tests.mirror_job.test_mirror_many_kills import Lake, killed_job, run
from tests.sink.helpers import config_file

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore:.*ORM-style PyMilvus API")]
HOLD = 60.0  # the bound of each wait inside a held snapshot


def _staged(chk: Path, cid: int) -> list[str]:
    """The staged batches (finished ones) of collection ``cid`` in the job's checkpoint."""
    return sorted(p.parent.name for p in (chk / "staged" / str(cid)).glob("batch-*/staged.json"))


def _has_s(location) -> bool:
    try:
        return "msgstream.snapshot_ts" in deltalake.DeltaTable(str(location)).metadata().configuration
    except Exception:  # no table there yet (deltalake's TableNotFoundError)
        return False


def test_other_tables_stream_while_a_snapshot_runs_and_its_rows_are_handed_over(spark, local_env, milvus_proxy,
                                                                                tmp_path):
    """db1.a and db1.b are in Milvus when a new job starts; a is snapshotted first, then b's snapshot is held (its
    first Query) while the test writes b's changes after its S and a's rows: a's table must take them in a batch
    while b's snapshot is held (before: every snapshot ran before the query started, 0 batches meanwhile). b's
    changes written during a's snapshot (before b's S: in b's snapshot) and after its S (staged, then handed
    over), and after the handover (streamed), inserts, upserts and deletes: b's table holds each once."""
    from msgstream_spark.jobs import mirror

    chans = [local_env.new_channel("beside") for _ in range(2)]
    cfg = Path(config_file(local_env, tmp_path))
    cfg.write_text(yaml.safe_dump({**yaml.safe_load(cfg.read_text()), "milvus.address": milvus_proxy.address,
                                   "milvus.requesttimeout": 3 * HOLD}))  # the held Query outlives no bound
    state = milvus_proxy.state
    root, chk = tmp_path / "lake", tmp_path / "chk"
    argv = ["--config", str(cfg), "--database", "db1", "--table-root", str(root), "--table-format", "delta",
            "--checkpoint", str(chk), "--snapshot", "initial", "--channels", ",".join(chans),
            "--trigger", "processing-time:200ms", "--timeout", "300", "--snapshot-concurrency", "1",
            "--num-snapshot-tasks", "1", "--progress-interval", "1"]
    seen: dict[str, object] = {}
    with local_env.client() as c:
        log = ManyLog(c, chans)
        two_pending(log, state, 11, 12)

        def hook(request) -> None:
            if request.collection_name == "a" and "a" not in seen:  # a's snapshot: b's S is later
                seen["a"] = True
                log.insert(12, [100, 101])
                log.delete(12, [0])
                log.upsert(12, [1], gen=1)
                log.tick()
            elif request.collection_name == "b" and "b" not in seen:  # b's positions and S taken: held here
                seen["b"] = True
                log.insert(12, [200, 201])
                log.delete(12, [2, 100])
                log.upsert(12, [3], gen=2)
                log.upsert(12, [200], gen=3)
                log.insert(11, [50])
                log.tick()
                try:  # a's table takes a batch (a's 50; b's rows before it staged) while b's snapshot is held
                    wait_until(lambda: 50 in table_rows(root / "db1" / "a"), HOLD, "a's row 50 in a's table")
                    seen["during"] = True
                except AssertionError as exc:
                    seen["during"] = exc
                seen["staged"] = _staged(chk, 12)

        state.on_query = hook
        out: list = []
        job = threading.Thread(target=lambda: out.append(mirror.run(mirror.build_parser().parse_args(argv), spark)))
        job.start()
        try:
            wait_until(lambda: "during" in seen, 2 * HOLD, "b's snapshot held", alive=lambda: _alive(job, out))
            wait_until(lambda: _has_s(root / "db1" / "b"), HOLD, "b's snapshot committed",
                       alive=lambda: _alive(job, out))
            log.insert(12, [300])  # the first batch after b's snapshot: its handover, then these rows
            log.delete(12, [3])
            log.upsert(11, [4], gen=1)
            log.tick()
            wait_until(lambda: (root / "db1" / "b").exists() and table_rows(root / "db1" / "b") ==
                       log.expected[("db1", "b", 12)], HOLD, "b's table equal to its rows",
                       alive=lambda: _alive(job, out))
        finally:
            state.on_query = None
            for q in spark.streams.active:
                q.stop()
            job.join(HOLD)
        log.close()
    assert seen["during"] is True, seen["during"]  # a streamed while b's snapshot was held
    assert seen["staged"], "b's changes after its S were staged while its snapshot ran"
    assert out and out[0]["handed_over"] == [11, 12], out
    for name, cid in (("a", 11), ("b", 12)):
        assert table_rows(root / "db1" / name) == log.expected[("db1", name, cid)], name
        ids = batches_committed(root / "db1" / name)
        assert len(ids) == len(set(ids)), (name, ids)
    staged_ids = [int(s.removeprefix("batch-")) for s in seen["staged"]]
    assert set(staged_ids) <= set(batches_committed(root / "db1" / "b"))  # each staged batch: its own record
    assert not (chk / "staged" / "12").exists()
    assert not any(k["pending"] for k in json.loads((chk / "collections.json").read_text()).values())


def _alive(job: threading.Thread, out: list) -> None:
    if not job.is_alive():
        raise AssertionError(f"the job ended early: {out}")


KILLS = {  # failpoint -> staged batches of b to await in the held snapshot before it is let go
    "kill-after-staging:22": 0,  # killed right after b's first staged batch; its snapshot never commits
    "kill-after-snapshot:22": 1,  # killed after b's snapshot committed, before its handover
    "kill-in-handover:22": 2,  # killed after the first of b's staged batches was applied to its table
}


@pytest.mark.parametrize("failpoint", list(KILLS))
def test_a_driver_killed_around_a_snapshot_beside_the_stream(spark, local_env, milvus_proxy, s3, tmp_path,
                                                             monkeypatch, failpoint):
    """A new job on the S3 server: db1.a and db1.b in Milvus; b's snapshot held while the stream stages b's
    changes, the driver SIGKILLed at ``failpoint``. The restart (the checkpoint, collections.json's pending b,
    its staged batches) leaves both tables equal to their rows, no batch recorded twice, b's staging gone."""
    lake = Lake(s3, tmp_path, monkeypatch)
    chans = [local_env.new_channel("bk") for _ in range(2)]
    state = milvus_proxy.state
    cfg = lake.config(local_env, tmp_path, **{"milvus.address": milvus_proxy.address,
                                              "milvus.requesttimeout": 3 * HOLD})
    argv = ["--config", cfg, "--database", "db1", *lake.args, "--snapshot", "initial", "--channels", ",".join(chans),
            "--num-snapshot-tasks", "1"]
    job: list = []
    with local_env.client() as c:
        log = ManyLog(c, chans)
        two_pending(log, state, 21, 22)

        def alive() -> None:
            if job and job[0].poll() is not None:
                raise AssertionError("the killed job ended")

        def hold(request) -> None:  # b's first Query: its S taken; b's changes now come after it
            if request.collection_name != "b" or "held" in seen:
                return
            seen["held"] = True
            for step in range(max(1, KILLS[failpoint])):
                log.insert(22, [100 + step, 110 + step])
                log.delete(22, [step])
                log.upsert(22, [5 + step], gen=step + 1)
                log.insert(21, [100 + step])
                log.tick()
                if KILLS[failpoint] == 0:  # the kill comes with the first staged batch
                    wait_until(lambda: job[0].poll() is not None, HOLD, "the driver killed after staging")
                    return
                wait_until(lambda n=step: len(_staged(lake.chk, 22)) > n, HOLD, f"b's staged batch {step + 1}",
                           alive=alive)
            if KILLS[failpoint] == 2:  # the handover comes with the first batch after b's snapshot committed
                threading.Thread(target=after_commit, daemon=True).start()

        def after_commit() -> None:
            wait_until(lambda: lake.keys("db1", "b", "_delta_log/"), HOLD, "b's snapshot committed", alive=alive)
            log.insert(21, [200])
            log.tick()

        seen: dict = {}
        state.on_query = hold
        try:
            killed_job(tmp_path, [*argv, "--trigger", "processing-time:200ms"], failpoint, started=job.append)
        finally:
            state.on_query = None
        assert lake.known()["22"]["pending"] and _staged(lake.chk, 22), lake.known()
        committed = lake.keys("db1", "b", "_delta_log/")
        if failpoint == "kill-after-staging:22":
            assert not committed  # no snapshot of b
        else:
            assert committed and "msgstream.snapshot_ts" in deltalake.DeltaTable(
                lake.table("db1", "b"), storage_options=s3.options()).metadata().configuration
            want = 0 if failpoint == "kill-after-snapshot:22" else 1
            assert len(lake.batches("db1", "b")) == want, lake.summary("db1", "b")  # staged batches applied
        log.insert(22, [300])  # while the job is down
        log.delete(22, [9])
        log.upsert(21, [1], gen=5)
        log.tick()
        again = run(spark, argv)
        log.close()
    assert 22 in again["handed_over"], again
    lake.check(log)  # every table equal to its rows, no batch recorded twice
    assert not (lake.chk / "staged" / "22").exists() and not lake.known()["22"]["pending"]


def test_a_collection_dropped_before_its_snapshot_commits_gets_no_table(spark, local_env, milvus_proxy, tmp_path):
    """db1.b is dropped (in Milvus and on the stream) while its snapshot runs beside the stream: the snapshot fails,
    the job goes on (before, the job failed; with pending recorded, every restart would have failed again): b gets
    no table (one of part of its rows would be wrong), its staged rows are removed, a is mirrored; a restart does
    not try b again."""
    from msgstream_spark.jobs import mirror

    chans = [local_env.new_channel("gone") for _ in range(2)]
    cfg = Path(config_file(local_env, tmp_path))
    cfg.write_text(yaml.safe_dump({**yaml.safe_load(cfg.read_text()), "milvus.address": milvus_proxy.address}))
    state = milvus_proxy.state
    state.databases |= {"db1"}
    root, chk = tmp_path / "lake", tmp_path / "chk"
    argv = ["--config", str(cfg), "--database", "db1", "--table-root", str(root), "--table-format", "delta",
            "--checkpoint", str(chk), "--snapshot", "initial", "--channels", ",".join(chans),
            "--num-snapshot-tasks", "1", "--progress-interval", "1"]
    with local_env.client() as c:
        log = ManyLog(c, chans)
        listed_collections(log, state, ("db1", "a", 31), ("db1", "b", 32))
        log.insert(31, range(5))
        log.insert(32, range(5))
        log.tick()

        def drop_b(request) -> None:  # b's first Query: b dropped in Milvus, then its later Queries fail
            if request.collection_name == "b" and ("db1", "b") in state.collections:
                del state.collections[("db1", "b")], state.models[("db1", "b")]
                log.insert(31, [7])
                log.drop(32)
                log.tick()

        state.on_query = drop_b
        try:
            first = mirror.run(mirror.build_parser().parse_args(argv), spark)
        finally:
            state.on_query = None
        log.insert(31, [8])
        log.tick()
        again = mirror.run(mirror.build_parser().parse_args(argv), spark)
        log.close()
    assert first["handed_over"] == [31] and sorted(first["tables"]) == ["db1.a"], first
    assert again["handed_over"] == [] and sorted(again["tables"]) == ["db1.a"], again
    assert table_rows(root / "db1" / "a") == log.expected[("db1", "a", 31)]
    assert not (root / "db1" / "b" / "_delta_log").exists() and not (chk / "staged" / "32").exists()
    assert json.loads((chk / "collections.json").read_text())["32"]["gone"]
