"""The mirror job is watchable (issue #44 part 5): its Prometheus endpoint, scraped over HTTP while it runs and
parsed with prometheus_client's parser, shows the batches, rows by op and table version the job reports; the
same figures are one JSON line per batch in the log; ``mirror status`` shows the maintenance state."""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.error
import urllib.request

import pytest

from tests.fixtures.ports import free_port
from tests.sink.helpers import config_file
from tests.spark import wal26_data as D
from tests.wal26 import producer as P

pytestmark = pytest.mark.slow


def scrape(port: int) -> dict[tuple, float]:
    """{(sample name, sorted labels): value} of the endpoint's text ({}: not serving yet)."""
    from prometheus_client.parser import text_string_to_metric_families

    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except urllib.error.URLError:  # the job serves once its table is open (after Spark and the start plan)
        return {}
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for fam in text_string_to_metric_families(text) for s in fam.samples}


def total(samples: dict, name: str, **labels) -> float:
    return sum(v for (n, ls), v in samples.items() if n == name and labels.items() <= dict(ls).items())


def wait_for(what: str, cond, job: threading.Thread, timeout: float = 90.0):
    end = time.monotonic() + timeout
    while time.monotonic() < end and job.is_alive():
        got = cond()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"not reached within {timeout} s (or the job ended): {what}")


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_the_endpoint_and_the_log_show_what_the_job_did(spark, local_env, tmp_path, caplog, capsys, fmt):
    from msgstream_spark.cli.main import main
    from msgstream_spark.jobs import mirror

    ch, tt, table, port = local_env.new_channel("metrics"), D.TT, tmp_path / "t", free_port()
    cfg = config_file(local_env, tmp_path)
    argv = ["--config", cfg, "--channels", ch, "--collection", "c26", "--table", str(table), "--snapshot", "never",
            "--table-format", fmt, "--trigger", "processing-time:500 milliseconds", "--timeout", "120",
            "--metrics-port", str(port), "--maintenance", "expire.every=1", "--progress-interval", "1"]
    out: dict = {}
    caplog.set_level(logging.INFO, logger="msgstream_spark.mirror.batches")
    with local_env.client() as c, c.create_producer(ch) as prod:
        P.write(prod, [P.create_collection(tt), P.insert(tt + 1, [1, 2, 3]), P.timetick(tt + 2)])
        job = threading.Thread(target=lambda: out.update(mirror.run(mirror.build_parser().parse_args(argv), spark)))
        job.start()
        try:
            name = "msgstream_mirror_rows_applied_total"
            wait_for("3 inserts", lambda: total(scrape(port), name, op="insert") == 3, job)
            P.write(prod, [P.insert(tt + 3, [1]), P.delete(tt + 4, [2]), P.timetick(tt + 5)])
            got = wait_for("an update and a delete", lambda: (s := scrape(port)) and total(
                s, name, op="update") == 1 and total(s, name, op="delete") == 1 and s, job)
        finally:
            for q in spark.streams.active:
                q.stop()
            job.join(60)
    assert not job.is_alive() and out, "the job ended with its result"
    assert total(got, "msgstream_mirror_batches_total", outcome="committed") == out["merged_batches"] >= 2
    assert total(got, "msgstream_mirror_rows_applied_total") == out["merged_changes"] == 5
    assert total(got, "msgstream_mirror_table_version") == out["table_version"]
    assert total(got, "msgstream_mirror_batch_seconds_count") == out["merged_batches"]
    assert total(got, "msgstream_mirror_maintenance_runs_total", task="expire") == out["maintenance"]["runs"][
        "expire"] >= 2
    assert total(got, "msgstream_mirror_channel_position_timestamp_seconds", channel=ch) == (tt + 5 >> 18) / 1000
    assert total(got, "msgstream_mirror_lag_seconds") > 0 and total(got, "msgstream_mirror_errors_total") == 0
    lines = [json.loads(r.getMessage()) for r in caplog.records if r.name == "msgstream_spark.mirror.batches"]
    last = [ln for ln in lines if ln["committed"]][-1]
    assert last["table_version"] == out["table_version"] and last["rows"] == {"insert": 0, "update": 1, "delete": 1}
    assert sum(ln["rows"]["insert"] for ln in lines if ln["committed"]) == 3

    capsys.readouterr()
    assert main(["mirror", "status", "--config", cfg, "--table", str(table)]) == 0
    s = json.loads(capsys.readouterr().out)
    m = s["maintenance"]
    assert s["version"] is not None and m["job"]["runs"]["expire"] == out["maintenance"]["runs"]["expire"]
    assert m["history"]["versions"] >= 2 and m["live_files"]["rows"] >= 2


def test_the_one_collection_job_shows_its_backlog_per_channel(spark, local_env, tmp_path):
    """``msgstream_mirror_backlog_seconds`` / ``_messages`` of a ``--collection`` job (as the database job's): a
    batch per tick (``--max-rows-per-trigger 1``) behind 12 one-row ticks leaves a backlog on the channel; once
    the job has taken every row it is 0."""
    from msgstream_spark.jobs import mirror

    ch, tt, table, port = local_env.new_channel("backlog"), D.TT, tmp_path / "t", free_port()
    argv = ["--config", config_file(local_env, tmp_path), "--channels", ch, "--collection", "c26", "--table",
            str(table), "--snapshot", "never", "--table-format", "delta", "--trigger",
            "processing-time:500 milliseconds", "--timeout", "120", "--metrics-port", str(port),
            "--progress-interval", "1", "--max-rows-per-trigger", "1"]
    out: dict = {}
    rows, backlog = "msgstream_mirror_rows_applied_total", "msgstream_mirror_backlog_messages"
    with local_env.client() as c, c.create_producer(ch) as prod:
        P.write(prod, [P.create_collection(tt), P.insert(tt + 1, [1]), P.timetick(tt + 2)])
        job = threading.Thread(target=lambda: out.update(mirror.run(mirror.build_parser().parse_args(argv), spark)))
        job.start()
        try:
            wait_for("the first insert", lambda: total(scrape(port), rows, op="insert") == 1, job)
            step = 100 << 18  # 100 ms of Milvus time between two ticks
            P.write(prod, [m for k in range(1, 13) for m in (P.insert(tt + k * step, [100 + k]),
                                                             P.timetick(tt + k * step + 1))])
            behind = wait_for("a backlog", lambda: (s := scrape(port)) and total(s, backlog) > 0 and s, job)
            caught_up = wait_for("13 inserts, no backlog left", lambda: (s := scrape(port))
                                 and total(s, rows, op="insert") == 13 and total(s, backlog) == 0 and s, job)
        finally:
            for q in spark.streams.active:
                q.stop()
            job.join(60)
    assert not job.is_alive() and out, "the job ended with its result"
    assert {dict(ls)["channel"] for (n, ls), _ in behind.items() if n == backlog} == {ch}
    assert total(behind, "msgstream_mirror_backlog_seconds") > 0
    assert total(caught_up, "msgstream_mirror_backlog_seconds") == 0 and out["merged_changes"] == 13
