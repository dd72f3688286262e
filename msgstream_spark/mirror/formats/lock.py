"""One writer per table: an exclusive lock on ``<table>/_msgstream_writer.lock`` held while a batch commits and
for a whole compaction or vacuum. The second writer is refused at once with the holder's pid and command.

``fcntl.flock``: the kernel drops the lock when its holder dies (a SIGKILLed job leaves no stale lock: the file
stays, holding the dead holder's record, and locks nothing; Python's descriptors are not inherited by the
processes the holder starts), on a local or NFSv4 file system that every writer sees; object stores need the
catalog's own concurrency. Within a process the lock is held by a thread (nested holds of that thread pass), not
by the process: a second thread is refused like a second process.
"""

from __future__ import annotations

import fcntl
import os
import socket
import sys
import threading
import time
from contextlib import contextmanager

from msgstream_spark.errors import MirrorError

LOCK_FILE = "_msgstream_writer.lock"


class Hold:
    """This process's hold of one table's lock: the threads inside it, each with its nesting depth. The thread
    that took it nests freely (a commit inside a compaction, a job's run and its commits on that thread); another
    thread is refused unless it is handed the hold (``writer_lock(..., share=hold)``: the job's foreachBatch runs
    on Spark's callback threads, the job's run holds the lock on its own)."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.threads: dict[int, int] = {}


_held: dict[str, Hold] = {}  # locations this process holds
_guard = threading.Lock()


def _enter(key: str, location: str, what: str, share: Hold | None) -> Hold | None:
    """The hold this thread joins (nested, or handed ``share``), None if the process holds no lock on ``key``;
    MirrorError if another thread of this process holds it."""
    tid = threading.get_ident()
    with _guard:
        h = _held.get(key)
        if h is None:
            return None
        if tid not in h.threads and share is not h:
            raise MirrorError(f"table {location} is being written by another thread of this process (pid "
                              f"{os.getpid()}: {h.what}); {what} refused: one writer per table, also within one "
                              "driver (two queries into one table?)")
        h.threads[tid] = h.threads.get(tid, 0) + 1
        return h


def _leave(h: Hold) -> None:
    tid = threading.get_ident()
    with _guard:
        h.threads[tid] -= 1
        if not h.threads[tid]:
            del h.threads[tid]


@contextmanager
def writer_lock(location: str, what: str, share: Hold | None = None):
    """Hold the table's writer lock while the block runs (yields the ``Hold``); MirrorError naming the holder if
    another process, or another thread of this one not handed ``share``, has it."""
    key = os.path.abspath(location)
    joined = _enter(key, location, what, share)
    if joined is not None:
        try:
            yield joined
        finally:
            _leave(joined)
        return
    created = not os.path.isdir(location)
    os.makedirs(location, exist_ok=True)
    path = os.path.join(location, LOCK_FILE)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)  # another thread's descriptor of ours conflicts too
        except BlockingIOError as e:
            holder = os.pread(fd, 512, 0).decode(errors="replace").strip() or "unknown"
            raise MirrorError(f"table {location} is being written by another writer ({holder}); {what} refused: "
                              "a mirror job and a compaction never write one table at once (stop the job, "
                              "or let it compact with --compact-every)") from e
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}: {' '.join(sys.argv)[:200]} since {time.ctime()}"
                  .encode(), 0)
        h = Hold(what)
        h.threads[threading.get_ident()] = 1
        with _guard:
            _held[key] = h
        try:
            yield h
        finally:
            with _guard:
                del _held[key]
    finally:
        if created and os.listdir(location) == [LOCK_FILE]:  # a refused run leaves no table directory behind
            os.unlink(path)
            os.rmdir(location)
        os.close(fd)  # closing drops the lock
