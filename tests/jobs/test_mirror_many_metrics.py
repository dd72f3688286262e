"""A many-collection mirror job is watchable and maintained like a one-collection one (issue #44 parts 4-5): one
Prometheus endpoint with a series per table, scraped over HTTP while the job runs and parsed with
prometheus_client's parser; a JSON line per table and batch; each table's maintenance on the job's policy."""

from __future__ import annotations

import json
import logging
import threading

import pytest

from tests.fixtures.ports import free_port
from tests.jobs.test_mirror_metrics import scrape, total, wait_for
from tests.mirror_job.many_log import ManyLog
from tests.sink.helpers import config_file

pytestmark = pytest.mark.slow


def test_one_endpoint_shows_every_table_of_a_database_job(spark, local_env, tmp_path, caplog):
    from msgstream_spark.jobs import mirror

    cfg = config_file(local_env, tmp_path)
    chans = [local_env.new_channel("manym") for _ in range(2)]
    root, port = tmp_path / "lake", free_port()
    argv = ["--config", cfg, "--database", "db1", "--table-root", str(root), "--table-format", "delta",
            "--snapshot", "never", "--channels", ",".join(chans), "--trigger", "processing-time:500 milliseconds",
            "--timeout", "120", "--metrics-port", str(port), "--maintenance", "expire.every=1",
            "--progress-interval", "1", "--max-rows-per-trigger", "1"]  # a batch per tick: a backlog builds
    out: dict = {}
    caplog.set_level(logging.INFO, logger="msgstream_spark.mirror.batches")
    with local_env.client() as c:
        log = ManyLog(c, chans)
        log.create("db1", "a", 21)
        log.create("db1", "b", 22)
        log.create("db2", "c", 23)  # another database: not selected
        log.insert(21, range(6))
        log.insert(22, range(4))
        log.insert(23, range(3))
        log.tick()
        job = threading.Thread(target=lambda: out.update(mirror.run(mirror.build_parser().parse_args(argv), spark)))
        job.start()
        name, backlog = "msgstream_mirror_rows_applied_total", "msgstream_mirror_backlog_messages"
        a, b = str(root / "db1" / "a"), str(root / "db1" / "b")
        try:
            wait_for("both tables' inserts", lambda: (s := scrape(port)) and total(s, name, table=a) == 6
                     and total(s, name, table=b) == 4, job)
            log.delete(21, [0, 1])
            log.tick()
            got = wait_for("a's deletes", lambda: (s := scrape(port)) and total(s, name, table=a, op="delete") == 2
                           and s, job)
            for pk in range(100, 112):  # 12 one-row steps, a tick after each: 12 batches of one row
                log.insert(22, [pk])
                log.tick()
            behind = wait_for("a backlog", lambda: (s := scrape(port)) and total(s, backlog) > 0 and s, job)
            caught_up = wait_for("b's 12 rows, no backlog left", lambda: (s := scrape(port))
                                 and total(s, name, table=b, op="insert") == 16
                                 and total(s, backlog) == 0 and s, job)
        finally:
            for q in spark.streams.active:
                q.stop()
            job.join(60)
            log.close()
    assert not job.is_alive() and out, "the job ended with its result"
    tables = {dict(ls).get("table") for (n, ls), _ in got.items() if n == name}
    assert tables == {a, b}, tables  # one series per selected table, none for db2.c
    assert total(got, name, table=b, op="delete") == 0 and total(got, name, table=a, op="insert") == 6
    assert out["metrics_port"] == port and sorted(out["maintenance"]) == [a, b]
    assert out["maintenance"][a]["runs"]["expire"] >= 1  # each table maintained on the job's policy
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "msgstream_spark.mirror.batches"]
    assert {ln["table"] for ln in lines if ln.get("committed")} == {a, b}
    # the backlog per channel: messages and Milvus time between a channel's newest position and the job's
    assert {dict(ls)["channel"] for (n, ls), _ in behind.items() if n == backlog} == set(chans)
    assert total(behind, "msgstream_mirror_backlog_seconds") > 0
    assert total(caught_up, "msgstream_mirror_backlog_seconds") == 0
