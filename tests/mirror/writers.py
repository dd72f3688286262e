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
