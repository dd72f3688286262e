"""A database batch read by the job's own tasks (``--batch-read tasks``, the default; ``spark.mirror_many_direct``):
the facts and the writing tasks read the batch's channel ranges themselves, planned from the checkpoint's offsets
as the source plans them; the stream's DataFrame is never read. The tables must be what the log says, and what
the job reading the DataFrame (``--batch-read stream``) makes of the same log."""

from __future__ import annotations

import pytest

from tests.mirror_job.many_log import ManyLog, table_rows
from tests.mirror_job.test_mirror_many import _argv, assert_tables, batches_committed, first_steps
from tests.sink.helpers import config_file

pytestmark = pytest.mark.slow


def _run(spark, cfg, chans, root, *more):
    from msgstream_spark.jobs import mirror

    return mirror.run(mirror.build_parser().parse_args(_argv(cfg, chans, root, *more)), spark)


def test_a_batch_read_by_its_tasks_mirrors_as_the_stream_read_does(spark, local_env, tmp_path, monkeypatch):
    from msgstream_spark.spark import mirror_many, mirror_many_write

    cfg = config_file(local_env, tmp_path)
    chans = [local_env.new_channel("mdirect") for _ in range(2)]
    tasks_root, stream_root = tmp_path / "lake_tasks", tmp_path / "lake_stream"

    def never(*a, **kw):
        raise AssertionError("the stream's DataFrame was read")

    with local_env.client() as c:
        log = ManyLog(c, chans)
        first_steps(log)
        with monkeypatch.context() as m:  # the DataFrame's facts and writing paths refuse to run
            m.setattr(mirror_many, "batch_facts", never)
            m.setattr(mirror_many_write, "collect_planned", never)
            out = _run(spark, cfg, chans, tasks_root)
        assert out["batches"] >= 3 and out["read_by_tasks"] == out["batches"], out  # the first batch too
        assert out["stream_pieces"] > 0, out  # the tasks' reads counted (Spark's progress counts none of them)
        assert sorted(out["tables"]) == ["db1.a", "db1.b", "db2.c", "db2.d"], out
        assert_tables(tasks_root, log)
        streamed = _run(spark, cfg, chans, stream_root, "--batch-read", "stream")
        assert streamed["read_by_tasks"] == 0 and streamed["batches"] == out["batches"], streamed
        assert_tables(stream_root, log)
        # the job restarted from its checkpoint: its next batches' starts are the checkpoint's offsets
        log.create("db1", "b", 15)
        log.insert(15, range(7))
        log.insert(13, [200])
        log.delete(14, [51, 52])
        log.upsert(11, [6, 7], gen=3)
        log.tick()
        again = _run(spark, cfg, chans, tasks_root)
        _run(spark, cfg, chans, stream_root, "--batch-read", "stream")
        log.close()
    assert again["read_by_tasks"] == again["batches"] >= 1, again
    assert_tables(tasks_root, log)
    assert_tables(stream_root, log)
    for t in ("db1/a", "db1/b", "db1/b__15", "db2/c", "db2/d"):
        assert table_rows(tasks_root / t) == table_rows(stream_root / t), t
        ids = batches_committed(tasks_root / t)
        assert len(ids) == len(set(ids)), (t, ids)


def test_a_batch_whose_offsets_the_checkpoint_lacks_is_read_through_the_stream(tmp_path):
    """No ``offsets/<batch>`` (a checkpoint Spark did not write, or another query's): the batch's ranges are not
    known here, so the job reads the DataFrame (``DirectRead.tasks`` answers None), never a guessed range."""
    from msgstream_spark.source.options import parse_read_options
    from msgstream_spark.spark.mirror_many_direct import DirectRead

    cfg = tmp_path / "log.yaml"
    cfg.write_text(f"mq.type: local\nlocal.path: {tmp_path / 'log.db'}\n")
    opts = parse_read_options({"config": str(cfg), "channels": "c_0", "output": "collections",
                               "subscription": "s"}, streaming=True)
    d = DirectRead(opts, str(tmp_path / "chk"))
    assert d.tasks(3, "{}") is None
    (tmp_path / "chk" / "offsets").mkdir(parents=True)
    (tmp_path / "chk" / "offsets" / "3").write_text('v1\n{}\n{"c_0": {"msgID": "", "ts": 0}}\n')
    assert d.tasks(3, "{}") is None  # its start (batch 2's end) is not there either


def test_a_python_worker_killed_while_its_task_reads_and_writes_is_retried(local_env, tmp_path, python_forks):
    """A writing task of the database job, reading the channels itself, loses its Python worker (SIGKILL) while it
    writes: Spark retries the task, which reads its ranges again; every table equals its collection, no batch in a
    table twice."""
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from msgstream_spark.spark.mirror import FAILPOINT_ENV

    cfg = config_file(local_env, tmp_path)
    chans = [local_env.new_channel("mdkill") for _ in range(2)]
    root = tmp_path / "lake"
    with local_env.client() as c:
        log = ManyLog(c, chans)
        first_steps(log)
        log.close()
    argv = [*_argv(cfg, chans, root), "--master", "local[2,4]"]  # local[2,4]: a task retried up to 4 times
    env = dict(os.environ, **{FAILPOINT_ENV: "kill-worker-in-files:0", "MSGSTREAM_JOBS_QUIET": "0"},
               PYTHONPATH=str(Path(__file__).resolve().parents[2]))
    proc = subprocess.run([sys.executable, "-m", "msgstream_spark.jobs.mirror", *argv], cwd=tmp_path, env=env,
                          timeout=900, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "Python worker exited unexpectedly (crashed)" in proc.stderr  # Spark saw the SIGKILL, retried the task
    out = json.loads(proc.stdout[proc.stdout.index("{"):])
    assert out["read_by_tasks"] == out["batches"] >= 3, out
    assert_tables(root, log)
    for t in ("db1/a", "db1/b", "db2/c", "db2/d"):
        ids = batches_committed(root / t)
        assert len(ids) == len(set(ids)), (t, ids)
