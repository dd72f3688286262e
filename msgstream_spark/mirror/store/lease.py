"""One writer per table, on the store itself: a lease object ``<table>/_msgstream_writer.lease``.

The lease is a small JSON record (a holder token, host, pid, command, what it is for, its epoch, when it
expires). A writer *acquires* it by put-if-absent; while it works, a background thread *renews* it every
``expiry_s / 3`` seconds by put-if-match on the etag it last wrote (compare-and-swap); it *releases* it by writing
an expired record the same way. A second writer finds a live lease and is refused at once with an error naming the
holder. A lease whose holder stopped renewing (it was killed, or lost the store) is *taken over* by
compare-and-swap on its etag, so of two writers that find it free exactly one gets it; nothing has to be cleared
by hand, and a killed writer blocks the next for at most twice ``expiry_s`` (default 60 s; see below).

Expiry is judged on the taker's own monotonic clock, never by comparing two machines' wall clocks: a record is
free once the taker has seen the same etag unchanged for the record's ``expiry_s`` (a record whose written expiry
has passed is watched that long, then taken over; one that says it is live is refused at once, and taken over by
a later ``acquire`` of the same ``Lease`` once that long has passed). The holder, likewise, counts from the start
of its last successful renewal on its own monotonic clock.

Every holder gets an *epoch*, one above its predecessor's (the record carries it): the table formats keep the
epoch of the newest holder that published one, and refuse the commits of a lower one (``store/writer.py``). A
lease is not a fence: a holder that stalled past its expiry and woke up is stopped by the table, not by the lease.
A holder that lost its lease (taken over, or renewals failing) also learns it at its next :meth:`Lease.check`,
which a writer calls before each batch and commit: it reads the lease's etag from the store and refuses if it is
not the one it wrote, or if the lease is within ``expiry_s / 3`` of running out. The token is the holder, not the
process: two ``Lease`` objects in one process are two writers, and the second is refused.

A holder on this very machine that is gone (the record names this host, boot and pid namespace, and its pid is
not running, or runs a process started at another time: a SIGKILLed job, a crashed compaction) does not make the
next writer wait: its lease is taken over at once, by the same compare-and-swap. Only a holder elsewhere (another
host or container) blocks the next writer for up to the expiry.
"""

from __future__ import annotations

import json
import os
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable

from msgstream_spark.config import mask_command
from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.store import uri as uris
from msgstream_spark.mirror.store.base import Store
from msgstream_spark.mirror.store.errors import AlreadyExists, Conflict, NotFound, StoreError
from msgstream_spark.mirror.store.settings import mask

LEASE_NAME = "_msgstream_writer.lease"
DEFAULT_EXPIRY_S = 60.0


class LeaseHeld(MirrorError):
    """Another writer holds the table's lease."""


class LeaseLost(MirrorError):
    """This writer no longer holds the table's lease: it must not commit."""


def _command(store: Store) -> str:
    """This process's command line for the record, every secret masked (then cut to 300 characters)."""
    return mask_command(sys.argv, store.options)[:300]


class Lease:
    """The writer lease of the table at ``location`` on ``store``; ``what`` names the work (in the refusal).
    ``clock``: the wall clock the record's times are written in (what a refusal shows); ``monotonic`` and
    ``sleep``: this process's own clock, on which every expiry is judged, and its wait (tests inject both)."""

    def __init__(self, store: Store, location: str, what: str, *, expiry_s: float = DEFAULT_EXPIRY_S,
                 clock: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic,
                 sleep: Callable[[float], None] = time.sleep, auto_renew: bool = True) -> None:
        self.store = store
        self.uri = uris.join(location, LEASE_NAME)
        self.location = location
        self.what = what
        self.expiry_s = float(expiry_s)
        self.clock = clock
        self.monotonic = monotonic
        self.sleep = sleep
        self.auto_renew = auto_renew
        self.token = uuid.uuid4().hex
        self.etag: str | None = None
        self.expires = 0.0
        self.epoch = 0  # this holder's place in the table's line of holders (see store/writer.py)
        self.lost: str | None = None
        self.last_error = "no renewal failed"
        self._renewed = 0.0  # this process's monotonic time just before the put of the record now held
        self._seen: tuple[str | None, float] | None = None  # another holder's record: (etag, first seen at)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _record(self, expires: float, epoch: int | None = None) -> bytes:
        return json.dumps({"holder": self.token, **_identity(os.getpid()), "command": _command(self.store),
                           "what": self.what, "expires": expires, "expiry_s": self.expiry_s,
                           "epoch": self.epoch if epoch is None else epoch, "written": self.clock()}).encode()

    def acquire(self) -> Lease:
        """Take the lease (create it, or take a free one over: released, its holder gone from this machine, or
        unchanged for its expiry on this process's clock); LeaseHeld naming the holder if it is live."""
        watched = None  # the holder of a record that changed while watched
        for _ in range(10):  # each round follows another writer's move (a create, a takeover, a release)
            t0, expires = self.monotonic(), self.clock() + self.expiry_s
            try:
                meta = self.store.put_if_absent(self.uri, self._record(expires, 1))
                return self._hold(meta.etag, expires, t0, 1)
            except AlreadyExists:
                pass
            try:
                data, meta = self.store.get(self.uri)
            except NotFound:
                continue  # released by deletion meanwhile: create it again
            current = _parse(data)
            if watched is not None and current.get("holder") == watched and _num(current, "expires"):
                raise LeaseHeld(self._refusal(current))  # it renewed while watched: live (its clock lags ours)
            free = self._free(current, meta.etag)
            if free is None:
                watched = current.get("holder")
                continue  # it changed while watched: look again
            if not free:
                raise LeaseHeld(self._refusal(current))
            epoch = int(_num(current, "epoch")) + 1  # above every holder before: the table refuses theirs
            t0, expires = self.monotonic(), self.clock() + self.expiry_s
            try:
                new = self.store.put_if_match(self.uri, self._record(expires, epoch), meta.etag)
                return self._hold(new.etag, expires, t0, epoch)
            except Conflict:
                continue  # another writer took it over first: look again
        raise LeaseHeld(f"table {self.location}: the writer lease kept changing hands; {self.what} refused")

    def _free(self, rec: dict, etag: str | None) -> bool | None:
        """Whether another holder's record ``rec`` (at ``etag``) may be taken over now: released (no expiry),
        its holder gone from this machine, or seen unchanged for its expiry on this process's clock (a record
        that says it expired is watched that long; one that says it is live is refused at once, and taken over
        by a later ``acquire`` of this object once that long has passed). None: it changed while watched."""
        if not _num(rec, "expires") or holder_gone(rec):
            return True
        expiry = _num(rec, "expiry_s") or self.expiry_s
        if self._seen is None or self._seen[0] != etag:
            self._seen = (etag, self.monotonic())
        until = self._seen[1] + expiry
        if self.monotonic() >= until:
            return True
        if _num(rec, "expires") > self.clock():
            return False
        while (left := until - self.monotonic()) > 0:  # its holder stopped renewing, by its own clock: watch
            self.sleep(min(left, max(expiry / 20, 0.01)))
            meta = self.store.head(self.uri)
            if meta is None or meta.etag != etag:
                return None
        return True

    def _refusal(self, rec: dict) -> str:
        left = _num(rec, "expires") - self.clock()
        holder = mask(f"pid {rec.get('pid')} on {rec.get('host')}: {rec.get('command', '')}", self.store.options)
        return (f"table {self.location} is being written by another writer ({holder}; {rec.get('what', '?')}); "
                f"{self.what} refused. Its lease expires in {left:.0f}s unless renewed: a mirror job and a "
                "compaction never write one table at once (stop the job, or let it compact with --compact-every)")

    def _hold(self, etag: str | None, expires: float, renewed: float, epoch: int) -> Lease:
        with self._lock:
            self.etag, self.expires, self._renewed, self.epoch, self.lost = etag, expires, renewed, epoch, None
        if self.auto_renew:
            self._stop.clear()
            self._thread = threading.Thread(target=self._renew_loop, name=f"lease {self.location}", daemon=True)
            self._thread.start()
        return self

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.expiry_s / 3):
            try:
                self.renew()
            except LeaseLost:
                return
            except StoreError as e:  # the store is unreachable: try again; check() refuses when time runs short
                with self._lock:
                    self.last_error = mask(str(e), self.store.options)

    def renew(self) -> None:
        """Push the expiry forward by compare-and-swap; LeaseLost if the lease is no longer this holder's."""
        with self._lock:
            self._put(self.epoch)

    def raise_epoch(self, epoch: int) -> None:
        """Raise this holder's epoch to ``epoch`` (a renewal carrying it): when the table already holds an epoch
        this high (the lease object was made anew). LeaseLost if the lease is no longer this holder's."""
        with self._lock:
            self._put(max(self.epoch, int(epoch)))

    def _put(self, epoch: int) -> None:
        """(Under the lock) this holder's record, with a new expiry and ``epoch``, by compare-and-swap."""
        if self.lost:
            raise LeaseLost(self.lost)
        t0, expires = self.monotonic(), self.clock() + self.expiry_s
        try:
            meta = self.store.put_if_match(self.uri, self._record(expires, epoch), self.etag or "")
        except Conflict as e:
            self.lost = (f"table {self.location}: the writer lease was taken over by another writer (this "
                         f"writer stalled past its {self.expiry_s:.0f}s expiry); {self.what} stops uncommitted")
            raise LeaseLost(self.lost) from e
        self.etag, self.expires, self._renewed, self.epoch = meta.etag, expires, t0, epoch

    def _left(self) -> float:
        """Seconds before another writer could take the lease over, on this process's clock."""
        return self._renewed + self.expiry_s - self.monotonic()

    def check(self) -> None:
        """Before a batch and before a commit: LeaseLost unless the store still has this holder's lease with
        time to spare (a third of the expiry, on this process's clock, since the last renewal began)."""
        with self._lock:
            if self.lost:
                raise LeaseLost(self.lost)
            meta = self.store.head(self.uri)
            if meta is None or meta.etag != self.etag:
                self.lost = (f"table {self.location}: the writer lease is no longer this writer's (taken over or "
                             f"removed); {self.what} stops uncommitted")
                raise LeaseLost(self.lost)
            if self._left() < self.expiry_s / 3:
                why = self.last_error
                raise LeaseLost(f"table {self.location}: the writer lease runs out in {self._left():.1f}s and "
                                f"could not be renewed ({why}); {self.what} stops uncommitted")

    def _stop_renewing(self) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=max(5.0, self.expiry_s))

    def release(self, delete: bool = False) -> None:
        """Stop renewing and leave an expired record (the next writer takes it at once); no error if lost.
        ``delete``: remove the lease object instead (a location left without a table), only while it is still
        this holder's with time to spare (nobody could have taken it over)."""
        self._stop_renewing()
        with self._lock:
            if self.lost or self.etag is None:
                return
            meta = self.store.head(self.uri) if delete else None
            if meta is not None and meta.etag == self.etag and self._left() >= self.expiry_s / 3:
                self.store.delete(self.uri)
            else:
                try:
                    self.store.put_if_match(self.uri, self._record(0.0), self.etag)
                except Conflict:
                    pass  # taken over meanwhile: nothing of ours to release
            self.etag = None

    def __enter__(self) -> Lease:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()


def _num(rec: dict, key: str) -> float:
    """A number of a lease record (0 if missing or not a number: a record another tool wrote)."""
    v = rec.get(key)
    return float(v) if isinstance(v, (int, float)) and not isinstance(v, bool) else 0.0


def _read(path: str) -> str:
    """The text of a /proc file, "" if it cannot be read (absent, or hidden: ``hidepid``, a sandbox)."""
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return ""


def _started(pid: int) -> str:
    """The start time of process ``pid`` (clock ticks since boot, /proc), "" if it cannot be read (no such
    process, or /proc does not show it)."""
    stat = _read(f"/proc/{pid}/stat")
    fields = stat.rsplit(")", 1)[1].split() if ")" in stat else []
    return fields[19] if len(fields) > 19 else ""


def _identity(pid: int) -> dict:
    """Who a lease record names: the host, its boot, the pid namespace, the pid and the process's start time."""
    try:
        ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        ns = ""
    return {"host": socket.gethostname(), "boot": _read("/proc/sys/kernel/random/boot_id"), "pidns": ns,
            "pid": pid, "started": _started(pid)}


def holder_gone(rec: dict) -> bool:
    """Whether the record's holder is a process of this machine (same host, boot, pid namespace) that is no
    longer running: its pid is free (``kill(pid, 0)`` answers ``ESRCH``), or runs a process /proc shows started
    at another time (the pid was reused). False whenever that cannot be known: a /proc that hides the process
    (``hidepid``, gVisor) or a pid of another user's live process is taken for the holder, alive."""
    here = _identity(os.getpid())
    if not here["boot"] or not here["pidns"] or not rec.get("started"):
        return False
    if any(rec.get(k) != here[k] for k in ("host", "boot", "pidns")):
        return False
    try:
        pid = int(rec.get("pid") or 0)
    except (TypeError, ValueError):
        return False
    if pid <= 0:  # kill(0) and kill(-n) signal process groups: never a holder's pid
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True  # ESRCH: no process has the pid
    except OSError:  # EPERM: it runs, as another user; anything else: unknown
        return False
    started = _started(pid)
    return bool(started) and started != rec["started"]


def _parse(data: bytes) -> dict:
    try:
        rec = json.loads(data)
        return rec if isinstance(rec, dict) else {}
    except ValueError:
        return {}  # not a lease record: treated as expired (taken over by compare-and-swap)
