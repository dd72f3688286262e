"""A many-collection batch spread over many collections gives each table a small share of it: that share is
written by one task (one data file per table and batch, one task's fixed costs), not by a task per partition of
the batch (issue #44's measure: 20 tables in one job); a large share keeps a task per partition."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.mirror_job.many_log import ManyLog
from tests.mirror_job.test_mirror_many import table_rows
from tests.sink.helpers import config_file

pytestmark = pytest.mark.slow


def data_files_per_batch(location: Path) -> dict[int, int]:
    """{stream batch id: data files its commit added} of a Delta table's mirror commits."""
    out = {}
    for f in sorted((location / "_delta_log").glob("*.json")):
        actions = [json.loads(line) for line in f.read_text().splitlines()]
        txn = [a["txn"]["version"] for a in actions if "txn" in a]
        if txn:
            out[int(txn[0])] = sum(1 for a in actions if "add" in a and a["add"].get("dataChange", True))
    return out


def test_a_small_share_of_a_batch_is_written_by_one_task(spark, local_env, tmp_path, monkeypatch):
    from msgstream_spark.jobs import mirror
    from msgstream_spark.spark import mirror_many

    cfg = config_file(local_env, tmp_path)
    chans = [local_env.new_channel("mtask") for _ in range(2)]
    root = tmp_path / "lake"
    with local_env.client() as c:
        log = ManyLog(c, chans)
        try:
            log.create("db1", "a", 41)
            log.create("db1", "b", 42)
            for lo in range(0, 40, 10):  # messages on both channels: a read task per channel
                log.insert(41, range(lo, lo + 10))
            log.insert(42, range(20))
            log.tick()
        finally:
            log.close()
    monkeypatch.setattr(mirror_many, "ONE_TASK_ROWS", 30)  # a's 40 rows: a task per partition; b's 20: one
    argv = ["--config", cfg, "--database", "db1", "--table-root", str(root), "--table-format", "delta",
            "--snapshot", "never", "--channels", ",".join(chans), "--progress-interval", "60"]
    mirror.run(mirror.build_parser().parse_args(argv), spark)
    assert sorted(table_rows(root / "db1" / "a")) == list(range(40))
    assert sorted(table_rows(root / "db1" / "b")) == list(range(20))
    many, one = data_files_per_batch(root / "db1" / "a"), data_files_per_batch(root / "db1" / "b")
    assert many[0] > 1, many
    assert one == {0: 1}, one
