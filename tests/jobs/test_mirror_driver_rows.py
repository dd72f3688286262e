"""No row of a micro-batch reaches the mirror's driver (issue #27 part 2): writing tasks keep their narrow
rows in changes files, planning tasks shuffle them by key and look the keys up, the driver receives file
lists and delete positions. Outcome-based: with ``spark.driver.maxResultSize`` at 1 MiB, a batch of 16,000
inserts (their narrow rows alone ~2 MB, what the driver used to plan from) and then one of 8,000 updates and
8,000 new keys (8,000 delete positions, 64 KB) are mirrored, and the table equals the published rows; the
first batch is planned by one task, the second by tasks taking the changes shuffled by key."""

from __future__ import annotations

import contextlib
import io

import pytest

from tests.jobs.test_mirror_history_tasks import _max_result_size
from tests.sink.helpers import config_file

pytestmark = pytest.mark.slow

ROWS = 16_000


def _publish(cfg: str, ch: str, start: int) -> None:
    from msgstream_spark.cli.main import main

    with contextlib.redirect_stdout(io.StringIO()):
        assert main(["publish", "--config", cfg, "-c", ch, "--synthetic", str(ROWS), "--dim", "2", "--start",
                     str(start), "--collection", "drv", "--no-progress"]) == 0


def test_a_large_batch_never_reaches_the_driver(spark, local_env, tmp_path, monkeypatch):
    import msgstream_spark.spark.mirror_tasks as sm
    from msgstream_spark.jobs import mirror
    from msgstream_spark.mirror.table import open_table

    ch, table = local_env.new_channel("drv"), tmp_path / "t"
    cfg = config_file(local_env, tmp_path)
    argv = ["--config", cfg, "--channels", ch, "--collection", "drv", "--table", str(table), "--table-format",
            "delta", "--snapshot", "never", "--progress-interval", "60"]
    with _max_result_size(spark, "1m"):
        _publish(cfg, ch, 0)
        first = mirror.run(mirror.build_parser().parse_args(argv), spark)
        _publish(cfg, ch, ROWS // 2)  # keys 8,000..15,999 again (updates), 16,000..23,999 new
        # the first batch was planned by one task; this one by tasks taking the changes shuffled by key
        monkeypatch.setattr(sm, "ONE_TASK_PLAN_ROWS", 1000)
        second = mirror.run(mirror.build_parser().parse_args(argv), spark)
    assert first["merged_changes"] == ROWS and second["merged_changes"] == ROWS
    t = open_table("delta", str(table), collection="drv", pk="pk", create=False).to_arrow()
    keys, ts = t.column("pk").to_pylist(), t.column("_ts").to_pylist()
    assert sorted(keys) == list(range(ROWS + ROWS // 2))  # every key once: the updated rows' old versions gone
    first_ts = max(t for k, t in zip(keys, ts) if k < ROWS // 2)
    assert all(t > first_ts for k, t in zip(keys, ts) if k >= ROWS // 2)  # updated keys: the second batch's rows
    changes = table / "data" / "_changes"
    assert not changes.exists() or not any(changes.iterdir())  # the batches' changes files are removed
