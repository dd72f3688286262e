"""A database job whose log carries no CreateCollection (its collections were created before the log's retention, or
the job starts at ``--from``): the schemas of the tables its first batch makes are inferred from the inserts by ONE
scan of the channels for all of them (``source.schema_many``), where each collection had a scan of its own (issue
#44: 20 scans of the channels at the job's start for 20 collections). The scans are counted at
``source.schema._scan_schemas`` (the real scan still runs); each table must equal its collection (read by
delta-rs)."""

from __future__ import annotations

import pytest

from tests.mirror_job.many_log import ManyLog, table_rows
from tests.sink.helpers import config_file

pytestmark = pytest.mark.slow


def test_the_first_batch_infers_every_new_collections_schema_by_one_scan(spark, local_env, tmp_path, monkeypatch):
    from msgstream_spark.jobs import mirror
    from msgstream_spark.source import schema

    scans: list[str | None] = []
    real = schema._scan_schemas

    def counted(opts, channels, *a, **kw):
        scans.append(opts.collection)
        return real(opts, channels, *a, **kw)

    monkeypatch.setattr(schema, "_scan_schemas", counted)
    chans = [local_env.new_channel("noddl") for _ in range(2)]
    root = tmp_path / "lake"
    names = {71: "a", 72: "b", 73: "c", 74: "d"}
    with local_env.client() as c:
        log = ManyLog(c, chans)
        for cid, name in names.items():  # no CreateCollection on the log: its inserts tell each schema
            log.colls[cid], log.expected[("db1", name, cid)] = ("db1", name), {}
            log.insert(cid, range(cid * 100, cid * 100 + 6))
        log.tick()
        log.close()
    out = mirror.run(mirror.build_parser().parse_args([
        "--config", config_file(local_env, tmp_path), "--database", "db1", "--table-root", str(root),
        "--table-format", "delta", "--snapshot", "never", "--channels", ",".join(chans),
        "--progress-interval", "1"]), spark)
    assert sorted(out["tables"]) == ["db1.a", "db1.b", "db1.c", "db1.d"], out
    for (db, name, _), rows in log.expected.items():
        assert table_rows(root / db / name) == rows, name
    assert scans == ["ids:71,72,73,74"], scans  # one scan for the four (the old code: one per collection)
