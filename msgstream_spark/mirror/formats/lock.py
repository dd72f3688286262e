"""One writer per table: the table's writer lease on its store (:class:`msgstream_spark.mirror.store.Lease`,
``<table>/_msgstream_writer.lease``), held while a batch commits, for a whole compaction or vacuum, and for a
mirror job's whole run. The second writer is refused at once with the holder's host, pid and command.

The lease lives in the table's own store, so it excludes writers wherever they run (other hosts, other
containers; a local directory too). A killed holder blocks the next writer for at most the lease's expiry
(60 s; at once on the same machine, where its death is seen) and nothing has to be cleared by hand. Every commit
calls :meth:`Hold.check` right before it publishes: a holder that lost its lease (it stalled past the expiry and
another writer took it) stops uncommitted.

Within a process the lease is held by a thread (nested holds of that thread pass), not by the process: a second
thread is refused like a second process, unless it is handed the hold (``writer_lock(..., share=hold)``: the
job's foreachBatch runs on Spark's callback threads while the job's run holds the lease).
"""

from __future__ import annotations

import os
import threading
from contextlib import contextmanager

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.store import Lease, Store, uri
from msgstream_spark.mirror.store.lease import LEASE_NAME


class Hold:
    """This process's hold of one table's lease: the threads inside it, each with its nesting depth."""

    def __init__(self, what: str, lease: Lease) -> None:
        self.what = what
        self.lease = lease
        self.threads: dict[int, int] = {}

    def check(self) -> None:
        """Before a commit publishes: LeaseLost (a MirrorError; nothing may be committed) unless the store still
        holds this writer's lease with time to spare."""
        self.lease.check()


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
        lease.release()
        if fresh and _only_the_lease(store, location):  # a refused or failed first run leaves no table behind
            store.delete(lease.uri)
            _remove_empty_dir(store, location)


def _remove_empty_dir(store: Store, location: str) -> None:
    """A local location's directory, once empty (object stores have no directories)."""
    loc = uri.parse(location)
    if loc.kind == "local":
        try:
            os.rmdir(loc.key)
        except OSError:
            pass  # not empty (another writer began meanwhile) or gone: nothing to tidy
