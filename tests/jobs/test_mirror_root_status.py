"""``msgstream mirror status --table-root``: every table a many-collection job keeps, answered at once (issue #44
part 5): each with its database, version, last batch, freshness and backlog, and the dropped one's mark. A table
no batch touched since its last commit is as fresh as the job (the job's last committed batch), not left behind
by the other collections' rows on the shared channels."""

from __future__ import annotations

import json

import pytest

from tests.mirror_job.many_log import ManyLog
from tests.sink.helpers import config_file

pytestmark = pytest.mark.slow


def _run(spark, cfg: str, chans: list[str], root) -> dict:
    from msgstream_spark.jobs import mirror

    argv = ["--config", cfg, "--database", "db1", "--table-root", str(root), "--table-format", "delta",
            "--snapshot", "never", "--channels", ",".join(chans), "--progress-interval", "60"]
    return mirror.run(mirror.build_parser().parse_args(argv), spark)


def _status(capsys, cfg: str, *argv: str) -> tuple[int, dict]:
    from msgstream_spark.cli.main import main

    capsys.readouterr()
    rc = main(["mirror", "status", "--config", cfg, *argv])
    return rc, json.loads(capsys.readouterr().out)


def test_status_of_a_table_root_lists_every_table_with_its_state(spark, local_env, tmp_path, capsys):
    cfg = config_file(local_env, tmp_path)
    chans = [local_env.new_channel("mroot") for _ in range(2)]
    root = tmp_path / "lake"
    with local_env.client() as c:
        log = ManyLog(c, chans)
        try:
            for cid, name in ((31, "a"), (32, "b"), (33, "c")):
                log.create("db1", name, cid)
                log.insert(cid, range(5))
            log.tick()
            _run(spark, cfg, chans, root)  # batch 0: a, b and c
            log.insert(31, range(5, 9))
            drop_ts = log.drop(32)
            log.tick()
            _run(spark, cfg, chans, root)  # batch 1: a only; b dropped; c untouched
            log.insert(31, [50, 51, 52])  # after the job: a's backlog
            log.tick()
        finally:
            log.close()
    rc, doc = _status(capsys, cfg, "--table-root", str(root))
    assert rc == 0, doc
    by = {t["collection"]: t for t in doc["tables"]}
    assert sorted(by) == ["a", "b", "c"] and {t["database"] for t in by.values()} == {"db1"}
    a, b, c = by["a"], by["b"], by["c"]
    assert (a["collection_id"], a["table"]) == (31, str(root / "db1" / "a"))
    assert a["last_batch"] == 1 and b["last_batch"] == 0 and c["last_batch"] == 0
    assert a["version"] > c["version"] >= 0
    assert b["dropped_ts"] == drop_ts and a["dropped_ts"] is None and not b["stalled"]
    assert a["backlog_rows"] == 3  # the 3 rows written after the job ended
    # c's own last commit is batch 0's, but the job has applied batch 1 to every table: c is as fresh as a
    assert c["watermark_source"] == "job" and c["batch"] == 1 and c["backlog_rows"] == 3
    assert c["freshness_ms"] == a["freshness_ms"]
    assert doc["job_batch"] == 1 and doc["summary"]["tables"] == 3 and doc["summary"]["dropped"] == 1


def test_status_wants_a_table_or_a_table_root(local_env, tmp_path, capsys):
    from msgstream_spark.cli.main import main

    cfg = config_file(local_env, tmp_path)
    assert main(["mirror", "status", "--config", cfg]) == 2
    assert "--table-root" in capsys.readouterr().err
