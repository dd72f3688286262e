"""The database job holds each table's writer lease across its batches, as the one-collection job holds its
table's for its run: taken at the table's first batch, released at the job's end (issue #44: the per-table cost of
a batch). A batch of a table the job already holds takes no lease (no lease object created or taken over, no new
epoch), and each table still gets exactly one commit per batch with its own batch record."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tests.mirror_job.many_log import rounds_log, table_rows
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
    # three rounds, each touching every table, each its own batch; each also updates an existing key (the plan
    # finds it in the live files)
    log = rounds_log(local_env, chans, names, 3, lambda log, r: log.upsert(51, [5100], gen=r + 1))
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


def test_a_table_whose_held_lease_is_taken_over_fails_its_batch_and_the_rerun_takes_it_again(
        spark, local_env, tmp_path, monkeypatch):
    """Between two batches another writer takes table a's lease over (its record replaced: a new holder, a higher
    epoch): a's next batch fails naming its table and lease, the other table's commits; the lease found lost is
    given up, and the rerun takes it anew and completes a."""
    from pyspark.errors import StreamingQueryException

    from msgstream_spark.jobs import mirror
    from msgstream_spark.spark import mirror_many_write as mw

    cfg = config_file(local_env, tmp_path)
    chans = [local_env.new_channel("mlost") for _ in range(2)]
    root = tmp_path / "lake"
    names = {61: "a", 62: "b"}
    log = rounds_log(local_env, chans, names, 2)
    real = mw.ManyWrite.__call__
    seen = []

    def then_taken_over(self, df, batch_id, todo, *a, **kw):
        real(self, df, batch_id, todo, *a, **kw)
        seen.append(batch_id)
        where = root / "db1" / "a" / "_msgstream_writer.lease"
        if len(seen) == 1:  # another writer's record (released at once, so that the rerun may take it over)
            rec = {**json.loads(where.read_text()), "holder": "another-writer", "expires": 0, "epoch": 7}
            where.write_text(json.dumps(rec))

    monkeypatch.setattr(mw.ManyWrite, "__call__", then_taken_over)
    argv = ["--config", cfg, "--database", "db1", "--table-root", str(root), "--table-format", "delta",
            "--snapshot", "never", "--channels", ",".join(chans), "--max-rows-per-trigger", "2",
            "--progress-interval", "60"]
    with pytest.raises(StreamingQueryException) as err:  # the batch's error, raised by the query
        mirror.run(mirror.build_parser().parse_args(argv), spark)
    assert "writer lease" in str(err.value) and str(root / "db1" / "a") in str(err.value), err.value
    a_done, b_done = commits(root / "db1" / "a"), commits(root / "db1" / "b")
    assert len(b_done) == len(a_done) + 1, (a_done, b_done)  # b's batch committed, a's not
    monkeypatch.setattr(mw.ManyWrite, "__call__", real)
    mirror.run(mirror.build_parser().parse_args(argv), spark)  # a's lease taken anew (a higher epoch)
    for cid, name in names.items():
        assert table_rows(root / "db1" / name) == log.expected[("db1", name, cid)], name
        batches = [b for _, b in commits(root / "db1" / name)]
        assert batches == sorted(set(batches)), (name, batches)
    assert lease_record(root / "db1" / "a")["epoch"] == 8
