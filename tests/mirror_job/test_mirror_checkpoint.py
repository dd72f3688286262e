"""jobs/mirror.py on the embedded log: a table and its checkpoint belong together (issue #32, item 7).

Without its checkpoint a table that took stream batches is not replayed from the snapshot's positions or
``--starting`` (an insert whose delete came in a later batch would reappear until that delete replays): the
job refuses, naming the checkpoint. A checkpoint without its table (the table directory removed, the
checkpoint kept), or one whose batches the table never took, is refused too instead of silently resuming.
"""

from __future__ import annotations

import shutil

import pyarrow as pa
import pytest

from msgstream_spark.errors import MirrorError
from tests.sink.helpers import config_file
from tests.spark import wal26_data as D
from tests.wal26 import producer as P

pytestmark = pytest.mark.slow


def run_mirror(spark, cfg, ch, table, *extra, fmt="delta"):
    from msgstream_spark.jobs import mirror

    return mirror.run(mirror.build_parser().parse_args([
        "--config", cfg, "--channels", ch, "--collection", "c26", "--table", str(table), "--table-format", fmt,
        "--snapshot", "never", "--progress-interval", "1", "--max-rows-per-trigger", "2", *extra]), spark)


def rows(fmt, table) -> list[int]:
    from msgstream_spark.mirror.table import open_table

    t = open_table(fmt, str(table), collection="c26", pk="pk", create=False)
    return sorted(r["pk"] for r in t.to_arrow().to_pylist())


def log_with_a_later_delete(local_env, name: str) -> str:
    """An insert of pks 1 and 2, a tick, a delete of pk 1, a tick: two micro-batches (2 rows per trigger)."""
    ch, tt = local_env.new_channel(name), D.TT
    with local_env.client() as c, c.create_producer(ch) as prod:
        P.write(prod, [P.create_collection(tt), P.insert(tt + 1, [1, 2]), P.timetick(tt + 2), P.delete(tt + 3, [1]),
                       P.timetick(tt + 4)])
    return ch


@pytest.mark.parametrize("fmt", ["delta", "iceberg", "lance"])
def test_a_table_whose_checkpoint_is_gone_is_not_replayed(spark, local_env, tmp_path, fmt):
    ch, table = log_with_a_later_delete(local_env, f"mirror-chk-{fmt}"), tmp_path / "t"
    cfg = config_file(local_env, tmp_path)
    first = run_mirror(spark, cfg, ch, table, fmt=fmt)
    assert first["merged_batches"] >= 2 and rows(fmt, table) == [2]
    shutil.rmtree(tmp_path / "t_checkpoint")
    with pytest.raises(MirrorError, match=r"checkpoint .*t_checkpoint is gone.*--snapshot when_needed"):
        run_mirror(spark, cfg, ch, table, fmt=fmt)
    assert rows(fmt, table) == [2] and not (tmp_path / "t_checkpoint").exists()


def test_a_checkpoint_without_its_table_is_refused(spark, local_env, tmp_path):
    from msgstream_spark.mirror.table import open_table

    ch, table = log_with_a_later_delete(local_env, "mirror-orphan"), tmp_path / "t"
    cfg = config_file(local_env, tmp_path)
    run_mirror(spark, cfg, ch, table)
    shutil.rmtree(table)  # the table removed, its checkpoint kept: resuming would miss everything before it
    with pytest.raises(MirrorError, match=r"checkpoint .*t_checkpoint holds a query's progress but there is no table"):
        run_mirror(spark, cfg, ch, table, "--starting", "earliest")
    assert not table.exists()
    # a new (empty) table with the old checkpoint: its batches were never the table's
    open_table("delta", str(table), collection="c26", pk="pk", create=True,
               arrow_schema=pa.schema([("pk", pa.int64())]))
    with pytest.raises(MirrorError, match=r"committed batches that table .* never took"):
        run_mirror(spark, cfg, ch, table)
    shutil.rmtree(tmp_path / "t_checkpoint")
    assert run_mirror(spark, cfg, ch, table)["snapshot"]["mode"] == "stream" and rows("delta", table) == [2]


def test_a_second_run_resumes_from_its_checkpoint_reading_only_what_came_after(spark, local_env, tmp_path):
    """A run, then changes, then a run again: the second reads only the changes after the first's checkpoint and
    adds nothing twice; the table (read by delta-rs alone) equals the published rows. (Moved here from the
    cluster's mirror test, which runs the job once: docs/testing.md, "Moves".)"""
    import deltalake

    from msgstream_spark.cli.main import main as msgstream_cli
    from msgstream_spark.jobs import mirror
    from tests.mirror_job.synthetic_mirror import PUBLISHES, delta_files, expected, publish_argv, read_delta

    cfg = config_file(local_env, tmp_path)
    chans = [local_env.new_channel("resume") for _ in range(2)]
    table = tmp_path / "t"
    argv = ["--config", cfg, "--collection", "resumed", "--table", str(table), "--table-format", "delta",
            "--snapshot", "never", "--channels", ",".join(chans), "--max-rows-per-trigger", "150",
            "--progress-interval", "1"]
    for p in PUBLISHES[:2]:  # 200 rows, every 10th deleted, then 50..69 again (updated vectors)
        assert msgstream_cli(publish_argv(cfg, chans, "resumed", *p)) == 0
    first = mirror.run(mirror.build_parser().parse_args(argv), spark)
    assert first["merged_batches"] >= 2 and first["stream_rows"] == 240
    assert read_delta(str(table)) == expected(PUBLISHES[:2])
    more = [(200, 30, 0.0), PUBLISHES[2]]  # new keys, then 100..109 again, deleted
    for p in more:
        assert msgstream_cli(publish_argv(cfg, chans, "resumed", *p)) == 0
    second = mirror.run(mirror.build_parser().parse_args(argv), spark)
    assert second["stream_rows"] == 50 and second["skipped_batches"] == 0  # resumed: only the new changes
    assert read_delta(str(table)) == expected(PUBLISHES + more)
    files = delta_files(str(table))
    assert len(files) == len(set(files))
    batches = [(h.get("msgstream.query_id"), h.get("msgstream.batch_id")) for h in
               deltalake.DeltaTable(str(table)).history() if h.get("msgstream.batch_id") is not None]
    assert len(batches) == len(set(batches)) == first["merged_batches"] + second["merged_batches"]
