"""One writer per table: an exclusive lock on ``<table>/_msgstream_writer.lock`` held while a batch commits and
for a whole compaction or vacuum. The second writer is refused at once with the holder's pid and command.

``fcntl.flock``: the kernel drops the lock when its holder dies (a SIGKILLed job leaves no stale lock: the file
stays, holding the dead holder's record, and locks nothing; Python's descriptors are not inherited by the
processes the holder starts), on a local or NFSv4 file system that every writer sees; object stores need the
catalog's own concurrency.
"""

from __future__ import annotations

import fcntl
import os
import socket
import sys
import time
from contextlib import contextmanager

from msgstream_spark.errors import MirrorError

LOCK_FILE = "_msgstream_writer.lock"
_held: dict[str, int] = {}  # locations this process holds (nested holds, e.g. a job's run and its commits)


@contextmanager
def writer_lock(location: str, what: str):
    """Hold the table's writer lock while the block runs; MirrorError naming the holder if another has it."""
    key = os.path.abspath(location)
    if _held.get(key):
        _held[key] += 1
        try:
            yield
        finally:
            _held[key] -= 1
        return
    created = not os.path.isdir(location)
    os.makedirs(location, exist_ok=True)
    path = os.path.join(location, LOCK_FILE)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError as e:
            holder = os.pread(fd, 512, 0).decode(errors="replace").strip() or "unknown"
            raise MirrorError(f"table {location} is being written by another writer ({holder}); {what} refused: "
                              "a mirror job and a compaction never write one table at once (stop the job, "
                              "or let it compact with --compact-every)") from e
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()}: {' '.join(sys.argv)[:200]} since {time.ctime()}"
                  .encode(), 0)
        _held[key] = 1
        try:
            yield
        finally:
            del _held[key]
    finally:
        if created and os.listdir(location) == [LOCK_FILE]:  # a refused run leaves no table directory behind
            os.unlink(path)
            os.rmdir(location)
        os.close(fd)  # closing drops the lock
