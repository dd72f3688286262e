"""``--history-table`` through Spark's tasks (issue #29, the #27 rule): no micro-batch and no mirrored row
passes through the driver for the change log. Outcome-based: with ``spark.driver.maxResultSize`` far below
the batch (512-d vectors, 2 KiB a row), the job still keeps the log; the seed (the mirror's rows when the
history began) is written from the mirror's data files by tasks; as of the history's start the log equals
the table then, as of the end the table now. Embedded log, rows from ``msgstream publish``."""

from __future__ import annotations

import contextlib
import io
import os

import pytest

from msgstream_spark.errors import MirrorError
from tests.sink.helpers import config_file

pytestmark = pytest.mark.slow

DIM = 512  # 2 KiB of vector a row: 1,600 rows are ~3.3 MB, the tasks' narrow results ~0.2 MB
LIMIT = "1m"


def _publish(cfg: str, ch: str, start: int, rows: int) -> None:
    from msgstream_spark.cli.main import main

    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["publish", "--config", cfg, "-c", ch, "--synthetic", str(rows), "--start", str(start),
                     "--dim", str(DIM), "--collection", "hist", "--no-progress"]) == 0


def _run(spark, cfg: str, ch: str, table, *extra: str, fmt: str = "delta") -> dict:
    from msgstream_spark.jobs import mirror

    return mirror.run(mirror.build_parser().parse_args([
        "--config", cfg, "--channels", ch, "--collection", "hist", "--table", str(table), "--table-format", fmt,
        "--snapshot", "never", "--progress-interval", "60", *extra]), spark)


@contextlib.contextmanager
def _max_result_size(spark, value: str):
    """The driver's cap on a job's task results (read by each new task set from the context's live conf)."""
    conf = spark.sparkContext._conf  # the JVM SparkContext's own SparkConf, not a copy
    old = conf.get("spark.driver.maxResultSize", None)
    conf.set("spark.driver.maxResultSize", value)
    try:
        yield
    finally:
        conf.set("spark.driver.maxResultSize", old or "1g")


def _rows(t) -> dict[int, tuple]:
    return {r["pk"]: (r["_seq"], r["vec"][:2]) for r in t.to_pylist()}


def test_the_log_and_its_seed_are_written_by_tasks_the_driver_commits_files(spark, local_env, tmp_path):
    import deltalake

    from msgstream_spark.mirror.history.table import HistoryTable, as_of
    from msgstream_spark.mirror.table import open_table

    ch, table, hist = local_env.new_channel("hist"), tmp_path / "t", tmp_path / "h"
    cfg = config_file(local_env, tmp_path)
    _publish(cfg, ch, 0, 1600)
    _run(spark, cfg, ch, table)  # a mirror without history first: the log's seed is these rows
    mirror = open_table("delta", str(table), collection="hist", pk="pk", create=False)
    before = _rows(mirror.to_arrow())
    mirror_files = len(mirror.live_files())
    with _max_result_size(spark, LIMIT):
        with pytest.raises(Exception, match="maxResultSize"):  # the cap holds: the batch cannot reach the driver
            spark.read.parquet(str(table / "data")).toArrow()
        _publish(cfg, ch, 800, 1600)  # 800 updates of present keys, 800 new keys: one batch of 1,600 changes
        out = _run(spark, cfg, ch, table, "--history-table", str(hist))
    assert out["merged_changes"] == 1600
    after = _rows(mirror.to_arrow())

    h = HistoryTable(str(hist), "pk")
    log = h.to_arrow()
    ops = {op: sum(1 for r in log.column("op").to_pylist() if r == op) for op in ("insert", "update", "delete")}
    assert ops == {"insert": 1600 + 800, "update": 800, "delete": 0}
    assert _rows(as_of(h, h.began())) == before  # the seed: the table when the history began
    assert _rows(as_of(h, max(log.column("_ts").to_pylist()))) == after

    commits = [c for c in deltalake.DeltaTable(str(hist)).history() if c.get("operation") == "WRITE"]
    assert len(commits) == 2  # the seed and the batch, each once
    files = deltalake.DeltaTable(str(hist)).file_uris()
    data = os.path.join(os.path.abspath(hist), "data")
    assert all(f.removeprefix("file://").startswith(data) for f in files)  # files the tasks wrote
    assert len(files) >= mirror_files  # the seed: a file per mirror data file with live rows


def test_history_beside_an_iceberg_mirror_is_refused_naming_the_option(spark, local_env, tmp_path):
    ch = local_env.new_channel("hist")
    cfg = config_file(local_env, tmp_path)
    _publish(cfg, ch, 0, 1)
    with pytest.raises(MirrorError, match="--history-table .*--table-format delta"):
        _run(spark, cfg, ch, tmp_path / "t", "--history-table", str(tmp_path / "h"), fmt="iceberg")
    assert not (tmp_path / "t").exists() and not (tmp_path / "h").exists()
