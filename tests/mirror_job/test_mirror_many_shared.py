"""A database job's batch touching N tables is written by ONE Spark job (each task splits its rows by collection
id and writes each table's files), not by a writing and a planning job per table: a table whose whole share one
task wrote is planned in that task, the others by ONE planning job; the driver still commits each table once,
with its own batch record (issue #44: the fixed cost per table and batch)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.mirror_job.many_log import ManyLog
from tests.mirror_job.test_mirror_many import table_rows
from tests.sink.helpers import config_file

pytestmark = pytest.mark.slow


def commits(location: Path) -> list[tuple[str, int]]:
    """(query id, stream batch id) of each of a Delta table's mirror commits, in commit order."""
    out = []
    for f in sorted((location / "_delta_log").glob("*.json")):
        for line in f.read_text().splitlines():
            a = json.loads(line)
            if "txn" in a:
                out.append((a["txn"]["appId"], int(a["txn"]["version"])))
    return out


class Actions:
    """Counts the Spark actions collecting Arrow results (``DataFrame.toArrow``: how a mirror batch's writing
    and planning tasks hand their narrow rows to the driver), by the function that ran them."""

    def __init__(self, spark, monkeypatch) -> None:
        self.calls: list[str] = []
        cls = type(spark.range(1))
        real = cls.toArrow

        def counted(df, *a, **kw):
            self.calls.append(sys._getframe(1).f_code.co_name)
            return real(df, *a, **kw)

        monkeypatch.setattr(cls, "toArrow", counted)

    def take(self) -> list[str]:
        got, self.calls = self.calls, []
        return got


def rows_of(fmt: str, location: Path) -> dict[int, dict]:
    """A table's rows by primary key (pk, s, fv), read through the mirror's own table calls."""
    from msgstream_spark.mirror.table import open_table

    t = open_table(fmt, str(location), collection=location.name, pk="pk", create=False)
    t = t.to_arrow().select(["pk", "s", "fv"])
    out = {r["pk"]: r for r in t.to_pylist()}
    assert len(out) == t.num_rows, f"a key twice in {location}"
    return out


@pytest.mark.parametrize("fmt", ["delta", "lance"])  # lance: each table's files by its own writer (WriteSpec.finish)
def test_one_batch_over_n_tables_runs_one_job_writing_and_planning_small_shares(spark, local_env, tmp_path,
                                                                                  monkeypatch, fmt):
    from msgstream_spark.jobs import mirror

    cfg = config_file(local_env, tmp_path)
    chans = [local_env.new_channel("mshared") for _ in range(2)]
    root = tmp_path / "lake"
    argv = ["--config", cfg, "--database", "db1", "--table-root", str(root), "--table-format", fmt,
            "--snapshot", "never", "--channels", ",".join(chans), "--progress-interval", "60"]
    actions = Actions(spark, monkeypatch)
    names = {31: "a", 32: "b", 33: "c"}
    with local_env.client() as c:
        log = ManyLog(c, chans)
        try:
            for cid, name in names.items():
                log.create("db1", name, cid)
                log.insert(cid, range(cid * 100, cid * 100 + 20))
            log.insert(33, range(3300 + 50, 3300 + 60), partition=331)
            log.tick()
            first = mirror.run(mirror.build_parser().parse_args(argv), spark)
            load = actions.take()
            for cid in names:  # every table: rows updated and deleted (the plan finds them in the table's files)
                log.upsert(cid, [cid * 100 + 1], gen=1)
                log.delete(cid, [cid * 100 + 2])
                log.insert(cid, [cid * 100 + 99])
            log.drop_partition(33, 331)  # c's DropPartition: its deletes written in the same job
            log.tick()
            second = mirror.run(mirror.build_parser().parse_args(argv), spark)
            changes = actions.take()
        finally:
            log.close()
    for out in (first, second):
        assert out["batches"] == 1, out  # one stream batch, touching the three tables
        assert sorted(out["tables"]) == ["db1.a", "db1.b", "db1.c"], out
        assert all(t["batches"] == 1 for t in out["tables"].values()), out
    # the load: one job writing every table's files and planning each table in the task that wrote its whole share
    # (its tasks reading the channels themselves: spark.mirror_many_direct); the changes: c's DropPartition writes
    # its share in tasks of its own over the stream's DataFrame, so c is planned by a planning job
    assert load == ["write_units"], load
    assert changes == ["collect_planned", "plan_targets"], changes
    for cid, name in names.items():
        where = root / "db1" / name
        assert rows_of(fmt, where) == log.expected[("db1", name, cid)], name
        if fmt != "delta":
            continue
        assert table_rows(where) == log.expected[("db1", name, cid)], name  # as delta-rs reads it
        done = commits(where)  # each table: one commit per batch, with its own record (query id, batch id)
        assert [b for _, b in done] == [0, 1] and len({q for q, _ in done}) == 1, (name, done)
    assert sorted(log.expected[("db1", "c", 33)]) == [i for i in range(3300, 3320) if i != 3302] + [3399]
