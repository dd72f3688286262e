"""A restarted database job opens its tables and reads their Iceberg manifests ahead, in a thread of its own while
Spark starts the query (``ManyBatch.open_ahead``): the first batch's live files read only what is new, not every
manifest of every touched table in the driver's batch thread (a restarted job's first batch: ~10-20 ms a table,
one after another), and no table is opened by the job's thread (~10 ms of catalog work a table). A table that does
not open fails the job with its own error, as it did when the tables opened before the query."""

from __future__ import annotations

import threading
from collections import defaultdict

import pytest

from msgstream_spark.errors import MirrorError
from tests.mirror_job.many_log import ManyLog
from tests.mirror_job.test_mirror_many import _argv
from tests.sink.helpers import config_file

pytestmark = pytest.mark.slow


def _rows(root, name: str) -> dict:
    from msgstream_spark.mirror.table import open_table

    t = open_table("iceberg", str(root / "db1" / name), collection=name, pk="pk", create=False)
    return {r["pk"]: r["s"] for r in t.to_arrow().select(["pk", "s"]).to_pylist()}


def _opens(monkeypatch, fail: str | None = None) -> list:
    """The tables the job opens, with the thread each opens in (``fail``: the table of that name refuses)."""
    from msgstream_spark.mirror import table

    opened, real = [], table.open_table

    def open_table(fmt, location, **kw):
        opened.append((str(location).rsplit("/", 1)[-1], threading.current_thread().name))
        if fail and str(location).endswith("/" + fail):
            raise MirrorError(f"table {location}: refused by the test")
        return real(fmt, location, **kw)

    monkeypatch.setattr(table, "open_table", open_table)
    return opened


def test_a_restarted_job_reads_its_tables_manifests_ahead(spark, local_env, tmp_path, monkeypatch):
    from msgstream_spark.jobs import mirror
    from msgstream_spark.mirror.formats.iceberg import manifest_read

    cfg = config_file(local_env, tmp_path)
    chans = [local_env.new_channel("mwarm") for _ in range(2)]
    root = tmp_path / "lake"
    argv = [a if a != "delta" else "iceberg" for a in _argv(cfg, chans, root)]
    with local_env.client() as c:
        log = ManyLog(c, chans)
        log.create("db1", "a", 61)
        log.create("db1", "b", 62)
        for lo in range(0, 60, 20):  # several batches: several manifests a table
            log.insert(61, range(lo, lo + 20))
            log.insert(62, range(lo, lo + 20))
            log.tick()
        mirror.run(mirror.build_parser().parse_args(argv), spark)
        log.upsert(61, [1, 2], gen=1)
        log.delete(62, [3])
        log.tick()
        read: dict[str, set] = defaultdict(set)  # thread name -> the manifests (and lists) it read
        real = manifest_read._read

        def counted(path, io, kind):
            read[threading.current_thread().name].add(path)
            return real(path, io, kind)

        monkeypatch.setattr(manifest_read, "_read", counted)
        opened = _opens(monkeypatch)
        from msgstream_spark.mirror.store import lease

        leased, acquire = [], lease.Lease.acquire

        def taken(self, *a, **kw):
            leased.append((self.location.rstrip("/").rsplit("/", 1)[-1], threading.current_thread().name))
            return acquire(self, *a, **kw)

        monkeypatch.setattr(lease.Lease, "acquire", taken)
        import gc

        from msgstream_spark.spark.mirror_many import ManyBatch

        frozen, batch = [], ManyBatch._batch

        def watched(self, *a, **kw):  # the driver's objects of the job's start: set aside from full collections
            frozen.append(gc.get_freeze_count())
            return batch(self, *a, **kw)

        monkeypatch.setattr(ManyBatch, "_batch", watched)
        out = mirror.run(mirror.build_parser().parse_args(argv), spark)
        log.close()
    assert out["batches"] == 1, out
    assert sorted(opened) == [("a", "mirror-warm-up"), ("b", "mirror-warm-up")]  # none in the job's own thread
    assert sorted(leased) == [("a", "mirror-warm-up"), ("b", "mirror-warm-up")]  # nor by the first batch
    assert frozen and all(n > 0 for n in frozen) and gc.get_freeze_count() == 0, frozen
    ahead = read.pop("mirror-warm-up", set())
    assert ahead, dict(read)  # the restart read both tables' manifests ahead
    again = set().union(*read.values()) & ahead
    assert not again, again  # the batch read none of them a second time
    for cid, name in ((61, "a"), (62, "b")):
        assert _rows(root, name) == {k: r["s"] for k, r in log.expected[("db1", name, cid)].items()}, name


@pytest.mark.parametrize("batch", [True, False], ids=["in-a-batch", "no-batch"])
def test_a_table_that_does_not_open_on_restart_fails_the_job_with_its_error(spark, local_env, tmp_path, monkeypatch,
                                                                           batch):
    """The table opened ahead refuses: the job fails with that table's error (not the query's), whether a batch
    waited for the tables or none ran; the other table is untouched by the failed run."""
    from msgstream_spark.jobs import mirror

    cfg = config_file(local_env, tmp_path)
    chans = [local_env.new_channel("mfail") for _ in range(2)]
    root = tmp_path / "lake"
    argv = [a if a != "delta" else "iceberg" for a in _argv(cfg, chans, root)]
    with local_env.client() as c:
        log = ManyLog(c, chans)
        log.create("db1", "a", 71)
        log.create("db1", "b", 72)
        log.insert(71, range(10))
        log.insert(72, range(10))
        log.tick()
        mirror.run(mirror.build_parser().parse_args(argv), spark)
        before = _rows(root, "a")
        if batch:
            log.upsert(71, [1], gen=1)
            log.tick()
        _opens(monkeypatch, fail="b")
        with pytest.raises(MirrorError, match="table .*b: refused by the test"):
            mirror.run(mirror.build_parser().parse_args(argv), spark)
        log.close()
    assert _rows(root, "a") == before


def test_a_lease_held_by_another_writer_at_a_restart_fails_only_that_tables_batch(spark, local_env, tmp_path,
                                                                                 caplog):
    """Another writer holds table b's lease when the job restarts: the read-ahead only logs it (it takes a's), the
    first batch fails naming b and its holder while a's commits, as when the leases were taken at the first
    batch; once the other writer lets go, the rerun brings b up to date."""
    import logging

    from pyspark.errors import StreamingQueryException

    from msgstream_spark.jobs import mirror
    from msgstream_spark.mirror.store import Lease, open_store
    from tests.mirror_job.many_log import table_rows

    cfg = config_file(local_env, tmp_path)
    chans = [local_env.new_channel("mheld") for _ in range(2)]
    root = tmp_path / "lake"
    argv = _argv(cfg, chans, root)
    with local_env.client() as c:
        log = ManyLog(c, chans)
        log.create("db1", "a", 81)
        log.create("db1", "b", 82)
        log.insert(81, range(10))
        log.insert(82, range(10))
        log.tick()
        mirror.run(mirror.build_parser().parse_args(argv), spark)
        b_before = table_rows(root / "db1" / "b")
        log.upsert(81, [1], gen=1)
        log.upsert(82, [2], gen=1)
        log.tick()
        where = str(root / "db1" / "b")
        other = Lease(open_store(where), where, "another writer's compaction").acquire()
        try:
            with caplog.at_level(logging.INFO, logger="msgstream_spark.mirror.many_ahead"), \
                    pytest.raises(StreamingQueryException) as err:
                mirror.run(mirror.build_parser().parse_args(argv), spark)
        finally:
            other.release()
        assert "another writer's compaction" in str(err.value) and where in str(err.value), err.value
        assert f"table {where}: its writer lease not taken ahead" in caplog.text
        assert table_rows(root / "db1" / "a") == log.expected[("db1", "a", 81)]
        assert table_rows(root / "db1" / "b") == b_before
        mirror.run(mirror.build_parser().parse_args(argv), spark)
        log.close()
    for cid, name in ((81, "a"), (82, "b")):
        assert table_rows(root / "db1" / name) == log.expected[("db1", name, cid)], name
