"""One writer per table: the table's writer lease on its store (:class:`msgstream_spark.mirror.store.Lease`,
``<table>/_msgstream_writer.lease``), held for a batch or a commit, for a whole compaction or vacuum, and for a
mirror job's whole run. The second writer is refused at once with the holder's host, pid and command.

The lease lives in the table's own store, so it excludes writers wherever they run (other hosts, other
containers; a local directory too). A killed holder blocks the next writer for at most twice the lease's
expiry (60 s; at once on the same machine, where its death is seen) and nothing has to be cleared by hand. Every
batch and every commit calls :meth:`Hold.check` first: a holder that knows it lost its lease stops there.

A lease is not a fence: a holder can pass its check, stall past the expiry (a GC or VM pause, the store client's
retries) while another writer takes the lease, and commit after waking. So each holder has an *epoch*, one above
its predecessor's (the lease record carries it), and the table itself refuses a deposed holder: before a holder
deletes files another attempt may commit (an earlier attempt's claimed files of a batch, a vacuum's), it
publishes its epoch in the table (:meth:`Hold.fence`: a Delta version of its own / an Iceberg snapshot of its own),
and every commit that names files (a batch's, a compaction's, a repair's) passes its holder's epoch to the
format, which refuses it if the table holds a higher one. A deposed holder's commit read the table before the
epoch (then it loses the race for the next version, or the catalog refuses the snapshot it planned on, which
the epoch's moved) or after it (then it sees the higher epoch): either way nothing of it lands once the epoch is
in. A holder deletes another attempt's files only after its own epoch, or its own commit of that batch, is in
the table.

Within a process the lease is held by a thread (nested holds of that thread pass), not by the process: a second
thread is refused like a second process, unless it is handed the hold (``writer_lock(..., share=hold)``: the
job's foreachBatch runs on Spark's callback threads while the job's run holds the lease). :func:`hold_lease` takes
a lease no thread holds, released by a call (the database job: each table's, from its first batch to the job's end).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from contextlib import contextmanager
from typing import TypeVar

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.store import Lease, LeaseLost, Store, uri
from msgstream_spark.mirror.store.lease import LEASE_NAME

T = TypeVar("T")


class Hold:
    """This process's hold of one table's lease: the threads inside it, each with its nesting depth."""

    def __init__(self, what: str, lease: Lease) -> None:
        self.what = what
        self.lease = lease
        self.threads: dict[int, int] = {}
        self.published = False  # this holder's epoch is in the table
        self._fencing = threading.Lock()

    @property
    def epoch(self) -> int:
        """This holder's epoch (what its commits pass to the table, which refuses them below its own)."""
        return self.lease.epoch

    def check(self) -> None:
        """Before a batch starts and before a commit publishes: LeaseLost (a MirrorError; nothing may be
        committed) unless the store still holds this writer's lease with time to spare."""
        self.lease.check()

    def fence(self, table) -> None:
        """Before deleting files another attempt may yet commit: this holder's epoch published in ``table`` (once
        per hold), so that no commit of an earlier holder lands from then on. LeaseLost if the lease is no longer
        this holder's or the table holds a higher epoch. A table already at this epoch or above that this holder
        never published (the lease object was deleted and made anew) raises the holder's epoch above it first."""
        with self._fencing:
            self.lease.check()
            have = table.writer_epoch()
            if self.published and have == self.epoch:
                return
            if have >= self.epoch:
                self.lease.raise_epoch(have + 1)  # LeaseLost if another writer took the lease (and published)
            table.publish_epoch(self.epoch)  # LeaseLost if a higher epoch got in first
            self.published = True

    def commit(self, table, commit: Callable[[int], T]) -> T:
        """``commit(epoch)``, a commit of ``table`` passing this holder's epoch, after the lease check. A table
        that refuses the epoch as below its own when this holder published none is either a successor's (the
        lease was taken over: LeaseLost) or from before the lease object was made anew (the lease is still
        this holder's: its epoch is raised above the table's, and the commit made again)."""
        self.check()
        try:
            return commit(self.epoch)
        except LeaseLost as refused:
            if self.published:
                raise
            with self._fencing:
                have = table.writer_epoch()
                try:
                    if have >= self.epoch:
                        self.lease.raise_epoch(have + 1)
                except LeaseLost as lost:  # another writer took the lease: the table's refusal stands
                    raise refused from lost
        return commit(self.epoch)


_held: dict[str, Hold] = {}  # locations this process holds
_guard = threading.Lock()


def _enter(key: str, location: str, what: str, share: Hold | None) -> Hold | None:
    """The hold this thread joins (nested, or handed ``share``), None if the process holds no lease on ``key``;
    MirrorError if another thread of this process holds it."""
    tid = threading.get_ident()
    with _guard:
        h = _held.get(key)
        if h is None:
            return None
        if tid not in h.threads and share is not h:
            raise MirrorError(f"table {location} is being written by another thread of this process: {h.what}; "
                              f"{what} refused: one writer per table, also within one driver (two queries into "
                              "one table?)")
        h.threads[tid] = h.threads.get(tid, 0) + 1
        return h


def _leave(h: Hold) -> None:
    tid = threading.get_ident()
    with _guard:
        h.threads[tid] -= 1
        if not h.threads[tid]:
            del h.threads[tid]


def _only_the_lease(store: Store, location: str) -> bool:
    """Whether the location holds no object but (at most) the lease: no table was ever made there."""
    lease = uri.join(location, LEASE_NAME)
    return all(m.uri == lease for m in store.list(location))


@contextmanager
def writer_lock(store: Store, location: str, what: str, share: Hold | None = None):
    """Hold the table's writer lease while the block runs (yields the :class:`Hold`); MirrorError naming the
    holder if another writer, or another thread of this process not handed ``share``, has it."""
    key = uri.parse(location).uri()
    joined = _enter(key, location, what, share)
    if joined is not None:
        try:
            yield joined
        finally:
            _leave(joined)
        return
    fresh = _only_the_lease(store, location)
    lease = Lease(store, location, what).acquire()  # LeaseHeld (a MirrorError) names the holder
    h = Hold(what, lease)
    h.threads[threading.get_ident()] = 1
    with _guard:
        _held[key] = h
    try:
        yield h
    finally:
        with _guard:
            del _held[key]
        # a refused or failed first run leaves no table behind: the lease object is deleted while it is still
        # this holder's (never another writer's that took it meanwhile), else released as always
        empty = fresh and _only_the_lease(store, location)
        lease.release(delete=empty)
        if empty:
            _remove_empty_dir(store, location)


def hold_lease(store: Store, location: str, what: str) -> tuple[Hold, Callable[[], None]]:
    """The table's writer lease taken for longer than one block (the database job holds each table's across its
    batches, as the one-collection job holds its table's for its run): (the :class:`Hold`, held by no thread, each
    joining it with ``writer_lock(..., share=hold)``; the call that releases it, from any thread, once). Renewed
    in the background like any lease; MirrorError naming the holder if another writer has it."""
    block = writer_lock(store, location, what)
    h = block.__enter__()
    _leave(h)  # the job's, not this thread's: a thread not handed it is refused as a second writer
    done = threading.Lock()

    def release() -> None:
        if done.acquire(blocking=False):
            block.__exit__(None, None, None)

    return h, release


def _remove_empty_dir(store: Store, location: str) -> None:
    """A local location's directory, once empty (object stores have no directories)."""
    loc = uri.parse(location)
    if loc.kind == "local":
        try:
            os.rmdir(loc.key)
        except OSError:
            pass  # not empty (another writer began meanwhile) or gone: nothing to tidy
