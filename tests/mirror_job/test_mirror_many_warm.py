"""A restarted database job reads its Iceberg tables' manifests ahead, in a thread of its own while Spark starts the
query (``ManyBatch.warm_up``): the first batch's live files read only what is new, not every manifest of every
touched table in the driver's batch thread (a restarted job's first batch: ~10-20 ms a table, one after another)."""

from __future__ import annotations

import threading
from collections import defaultdict

import pytest

from tests.mirror_job.many_log import ManyLog
from tests.mirror_job.test_mirror_many import _argv
from tests.sink.helpers import config_file

pytestmark = pytest.mark.slow


def _rows(root, name: str) -> dict:
    from msgstream_spark.mirror.table import open_table

    t = open_table("iceberg", str(root / "db1" / name), collection=name, pk="pk", create=False)
    return {r["pk"]: r["s"] for r in t.to_arrow().select(["pk", "s"]).to_pylist()}


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
        out = mirror.run(mirror.build_parser().parse_args(argv), spark)
        log.close()
    assert out["batches"] == 1, out
    ahead = read.pop("mirror-warm-up", set())
    assert ahead, dict(read)  # the restart read both tables' manifests ahead
    again = set().union(*read.values()) & ahead
    assert not again, again  # the batch read none of them a second time
    for cid, name in ((61, "a"), (62, "b")):
        assert _rows(root, name) == {k: r["s"] for k, r in log.expected[("db1", name, cid)].items()}, name
