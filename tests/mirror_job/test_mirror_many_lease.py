"""The database job holds each table's writer lease across its batches, as the one-collection job holds its
table's for its run: taken at the table's first batch, released at the job's end (issue #44: the per-table cost of
a batch). A batch of a table the job already holds takes no lease (no lease object created or taken over, no new
epoch), and each table still gets exactly one commit per batch with its own batch record."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tests.mirror_job.many_log import ManyLog, table_rows
from tests.mirror_job.test_mirror_many_shared import commits
from tests.sink.helpers import config_file

pytestmark = pytest.mark.slow


def lease_record(location: Path) -> dict:
    return json.loads((location / "_msgstream_writer.lease").read_text())


def test_a_table_s_lease_is_taken_once_for_all_its_batches(spark, local_env, tmp_path, monkeypatch):
    from msgstream_spark.jobs import mirror
    from msgstream_spark.mirror.store import lease

    taken: Counter = Counter()  # lease acquisitions (a create or a takeover of the lease object) per table
    real = lease.Lease.acquire

    def counted(self):
        taken[Path(self.location).name] += 1
        return real(self)

    monkeypatch.setattr(lease.Lease, "acquire", counted)
    cfg = config_file(local_env, tmp_path)
    chans = [local_env.new_channel("mlease") for _ in range(2)]
    root = tmp_path / "lake"
    names = {51: "a", 52: "b", 53: "c"}
    with local_env.client() as c:
        log = ManyLog(c, chans)
        try:
            for cid, name in names.items():
                log.create("db1", name, cid)
            log.tick()
            for r in range(3):  # three rounds, each touching every table, each its own batch (8 rows a trigger)
                for cid in names:
                    log.insert(cid, [cid * 100 + r])
                log.upsert(51, [5100], gen=r + 1)  # an existing key updated: the plan finds it in the live files
                log.tick()
        finally:
            log.close()
    argv = ["--config", cfg, "--database", "db1", "--table-root", str(root), "--table-format", "delta",
            "--snapshot", "never", "--channels", ",".join(chans), "--max-rows-per-trigger", "4",
            "--table-concurrency", "2", "--progress-interval", "60"]
    out = mirror.run(mirror.build_parser().parse_args(argv), spark)
    for cid, name in names.items():
        where = root / "db1" / name
        assert table_rows(where) == log.expected[("db1", name, cid)], name
        done = commits(where)  # one commit per batch that touched it, each with its own record, none twice
        assert len(done) >= 3 and len({q for q, _ in done}) == 1, (name, done, out)
        batches = [b for _, b in done]
        assert batches == sorted(set(batches)), (name, done)
        assert out["tables"][f"db1.{name}"]["batches"] == len(done), out
        # its lease: taken once for all its batches (per batch before: one take, one new epoch each), and
        # released at the job's end (an expired record: the next writer takes it at once)
        assert taken[name] == 1, (name, taken, done)
        rec = lease_record(where)
        assert rec["epoch"] == 1 and rec["expires"] == 0, (name, rec)
    again = mirror.run(mirror.build_parser().parse_args(argv), spark)  # the next run takes each lease anew
    assert again["batches"] == 0 and all(lease_record(root / "db1" / n)["expires"] == 0 for n in names.values())
