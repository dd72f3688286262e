"""Writers of one table for the deposed-writer tests (#45 item 1): two batches, injected lease clocks, a batch
planned up to its commit."""

from __future__ import annotations

from msgstream_spark.mirror.store import Lease
from msgstream_spark.mirror.store import writer as lock
from tests.mirror.changes import delete, insert, to_arrow, upsert

BATCHES = [[insert(10, *[(p, f"a{p}") for p in range(8)])],
           [*upsert(20, (1, "b1"), (9, "b9")), delete(21, 2)]]


class Clock:
    """The writers' clocks, injected: the wall clock their lease records carry and their monotonic clock, whose
    waits pass at once (``sleep`` moves it)."""

    def __init__(self, now: float = 1_000_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds

    def hold(self, store, location: str, what: str) -> lock.Hold:
        lease = Lease(store, location, what, expiry_s=60, clock=self, monotonic=self, sleep=self.sleep,
                      auto_renew=False)
        return lock.Hold(what, lease.acquire())


def planned(t, msgs):
    """A batch as the write path makes it, up to its commit: files written, keys looked up, planned."""
    from msgstream_spark.mirror.write.batch import lookup_local
    from msgstream_spark.mirror.write.layout import plan, write_changes

    changes = to_arrow(msgs)
    t.prepare(changes.schema)
    narrow = write_changes(changes, t.write_spec())
    files = t.live_files()
    return plan(narrow, lookup_local(t, narrow.column("key").combine_chunks(), files), files.version)


def staged_files(t, adds: list[str], info: dict | None = None) -> list[str]:
    """The files a batch's tasks left for its commit (sorted): the data files it adds; for Lance, the fragments'
    data and key files the tasks wrote (their staged Parquet files are gone) and the tasks' reports."""
    if "lance" not in type(t).__module__:
        return sorted(adds)
    from msgstream_spark.mirror.formats.lance.fragments import data_path, key_file
    from msgstream_spark.mirror.formats.lance.staged import MARK, report_path, reports

    got = reports(t.store, adds, info or {})
    assert set(got) == set(adds)
    paths = [r[MARK]["files"][0]["path"] for r in got.values()]
    return sorted({data_path(t.root, p) for p in paths} | {key_file(t.root, p) for p in paths}
                  | {report_path(a) for a in adds})
