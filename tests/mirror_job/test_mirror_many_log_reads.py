"""What a database job's batch reads of each Delta table's log on S3 (issue #44, the load phase): the table's next
version is looked for twice per table and batch, at the batch's begin (its epoch and exactly-once checks, the
planning's live files, its schema answer from that read) and at its commit (which checks the log as it is then);
it was 4 times (the epoch check, the exactly-once check, the live files, the commit), then delta-rs's handle
brought up to date after the commit (a listing, the version just written read back twice) and the version after
it looked for by the maintenance's figures and the metrics: 8 GETs. Counted on the S3 server's own request log,
over the batch alone (the job's start reads each log whole)."""

from __future__ import annotations

import re

import pytest

from tests.mirror_job.many_log import ManyLog
from tests.mirror_job.test_mirror_many_kills import Lake, run

pytestmark = pytest.mark.slow


def _lines(s3) -> list[str]:
    return s3.server.log.read_text(errors="replace").splitlines()


class Window:
    """The S3 server's request lines logged while a database job's batch ran (its ``ManyWrite`` step)."""

    def __init__(self, s3, monkeypatch) -> None:
        from msgstream_spark.spark.mirror_many_write import ManyWrite

        self.lines: list[str] = []
        real = ManyWrite.__call__

        def counted(write, *a, **kw):
            start = len(_lines(s3))
            try:
                return real(write, *a, **kw)
            finally:
                self.lines += _lines(s3)[start:]

        monkeypatch.setattr(ManyWrite, "__call__", counted)

    def take(self) -> list[str]:
        got, self.lines = self.lines, []
        return got


def log_requests(lines: list[str], bucket: str, name: str) -> tuple[list[str], list[str]]:
    """(the GETs of objects in table ``name``'s ``_delta_log``: the name and status each, its listings)."""
    gets = [f"{m.group(1)} {m.group(2)}" for ln in lines
            if (m := re.search(rf"GET /{bucket}/lake/db1/{name}/_delta_log/(\S+) HTTP/1.1\S*\s+(\d+)", ln))]
    lists = [ln for ln in lines if re.search(rf"GET /{bucket}/?\?\S*prefix=lake(/|%2F)db1(/|%2F){name}(/|%2F)"
                                             r"_delta_log", ln)]
    return gets, lists


def test_a_batch_looks_for_each_tables_next_version_at_its_begin_and_commit(spark, local_env, s3, tmp_path,
                                                                           monkeypatch):
    lake = Lake(s3, tmp_path, monkeypatch)
    chans = [local_env.new_channel("mreads") for _ in range(2)]
    argv = ["--config", lake.config(local_env, tmp_path), "--database", "db1", "--snapshot", "never",
            "--channels", ",".join(chans), *lake.args]
    window = Window(s3, monkeypatch)
    names = {41: "a", 42: "b", 43: "c"}
    with local_env.client() as c:
        log = ManyLog(c, chans)
        try:
            for cid, name in names.items():
                log.create("db1", name, cid)
                log.insert(cid, range(cid * 100, cid * 100 + 20))
            log.tick()
            assert run(spark, argv)["batches"] == 1
            window.take()
            for cid in names:  # every table: a row updated, one deleted (the plan finds them in its files)
                log.upsert(cid, [cid * 100 + 1], gen=1)
                log.delete(cid, [cid * 100 + 2])
            log.tick()
            out = run(spark, argv)
            assert out["batches"] == 1, out
            batch = window.take()
        finally:
            log.close()
    lake.check(log)
    for name in names.values():
        versions = [f for f, _ in lake.commits("db1", name)]
        assert len(versions) == 3, versions  # created, the load, this batch (version 2)
        gets, lists = log_requests(batch, s3.bucket, name)
        # the begin's look and the commit's: version 2 is not there yet; the commit not read back, no version 3
        assert gets == ["00000000000000000002.json 404"] * 2, (name, gets)
        assert lists == [], (name, lists)
