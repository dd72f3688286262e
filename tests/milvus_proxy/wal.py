"""``DumpMessages`` over entries kept in an embedded-log SQLite file, following Milvus's 2.6 proxy.

Copied from Milvus (``internal/proxy`` ``DumpMessages`` and the streaming node's WAL scanner, as
described in ../shared/docs/milvus-dumpmessages.md). Milvus's repository was too large to mirror
here, so ``impl.go`` was not read line by line; the behaviour was checked against Milvus's own
threads instead: #50573/#50574 (a transaction expanded into Begin, the data messages that pass the
type filter, Commit, filtered as one unit at the commit's time tick; ``include_start_message``,
default "after"), milvus-proto #616/#617, #48389/#48390 (version-0 ``_lc``), and the proxy's
stream-interceptor test (#52387: ``DumpMessages`` authenticated). What it copies:

* request checks in Milvus's order and with Milvus's texts, as gRPC UNKNOWN errors;
* ``include_start_message``: from the id, or after it; a start id of another WAL replays the whole
  WAL; an id that retention removed, or that lies past the end, restarts at the oldest retained
  entry without an error (Kafka's ``auto.offset.reset=earliest``);
* entries are buffered and released sorted by ``_tt`` at each TimeTick; an entry below the last
  released tick (a time-tick violation) is dropped; TimeTick, Flush, CreateSegment and RollbackTxn
  are never sent;
* a committed transaction is one unit at its Commit's ``_tt``, sent as Begin, bodies, Commit, each
  re-timed to the Commit's ``_tt`` and ``_lc`` (``_lcs`` removed); a rolled-back transaction never
  appears; bodies or a Commit whose Begin lies before the start are ignored;
* ``start_timetick`` skips what is below it; the first tick or unit above ``end_timetick`` ends
  the stream cleanly; without ``end_timetick`` the stream tails until cancelled;
* each call first *writes* one TimeTick with the current TSO into the WAL (Milvus's scanner forces
  a persisted tick when it starts), so every call leaves an entry behind that is never sent
  (``write_ticks=False`` turns this off).

* a pre-upgrade 2.5 entry (no ``_v``) is a version-0 message (old_version.py): its body kept, its
  properties rebuilt (``_v`` "0", ``_t``, ``_tt`` = BeginTs, ``_vc``, ``_h``, ``_lc`` 30 version-0
  messages back in the scan); a version-0 TimeTick releases like any tick and is not sent.

Simplified: Milvus also writes TimeTicks after appends; this server acts as if one with the
current TSO followed the last stored entry at each poll, and writes nothing then. Entries without
``_v`` whose payload is no 2.5 message (the conformance suite's opaque payloads: Milvus's streaming
node would panic on them) are sent unchanged in log order, with the store's timestamp standing in
for ``_tt`` in the bounds. Transactions never expire.
"""

from __future__ import annotations

import base64
import contextlib
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from msgstream_spark.errors import DataLossError
from msgstream_spark.mq.local.client import LocalClient
from msgstream_spark.mq.local.message_id import LocalMessageID
from tests.milvus_proxy import old_version

ROCKSMQ = 1
FILTERED = {"1", "4", "10", "902"}  # TimeTick, Flush, CreateSegment, RollbackTxn
_B36 = "0123456789abcdefghijklmnopqrstuvwxyz"


class InvalidRequest(Exception):
    """A request Milvus refuses (gRPC UNKNOWN with Milvus's text)."""


def b36(value: int) -> str:
    if value == 0:
        return "0"
    sign, value = ("-", -value) if value < 0 else ("", value)
    out = ""
    while value:
        value, r = divmod(value, 36)
        out = _B36[r] + out
    return sign + out


_tso_lock = threading.Lock()
_tso_last = 0


def tso_now() -> int:
    """The proxy's TSO: physical milliseconds << 18, strictly increasing (the logical part counts within
    one millisecond), as Milvus's allocator."""
    global _tso_last
    with _tso_lock:
        _tso_last = max(int(time.time() * 1000) << 18, _tso_last + 1)
        return _tso_last


def _txn_id(props: dict) -> int | None:
    raw = props.get("_tx")
    if raw is None:
        return None
    data = base64.b64decode(raw)
    if not data or data[0] != 0x08:
        return 0
    value, shift, i = 0, 0, 1
    while True:
        b = data[i]
        value |= (b & 0x7F) << shift
        i, shift = i + 1, shift + 7
        if b < 0x80:
            return value


@dataclass
class Unit:
    """What is released together: one entry, or a committed transaction."""

    tt: int
    entries: list  # (id, payload, properties)
    raw_tt: int | None = None  # set for entries that are not WAL messages: the store's timestamp


@dataclass
class Scan:
    """One call's state: the buffer, open transactions and the last released tick."""

    start_tt: int
    end_tt: int
    old: old_version.OldVersion
    buffer: list = field(default_factory=list)
    txns: dict = field(default_factory=dict)
    last_tick: int = 0
    ended: bool = False
    pending: list = field(default_factory=list)


def check_request(pchannel: str, start_id: str | None, start_tt: int, end_tt: int) -> None:
    if not pchannel:
        raise InvalidRequest("missing parameter[missing_param=pchannel]")
    if not start_id:
        raise InvalidRequest("missing parameter[missing_param=start_message_id]")
    if start_tt and end_tt and end_tt < start_tt:
        raise InvalidRequest("end_timetick must be greater than or equal to start_timetick: invalid parameter")
    try:
        int(start_id, 36)
    except ValueError:
        raise InvalidRequest(f"invalid start_message_id: strconv.ParseInt: parsing {start_id!r}: "
                             "invalid syntax: invalid parameter") from None


def open_reader(store: LocalClient, pchannel: str, start_id: str, wal_name: int, include: bool):
    """A store reader positioned as Milvus's scanner would be."""
    reader = store.reader(pchannel)
    target = int(start_id, 36)
    last = store.latest_message_id(pchannel)
    if wal_name not in (0, ROCKSMQ) or target <= 0 or last is None or target > last.offset:
        reader.seek(LocalMessageID(-1), inclusive=True)  # another WAL's id, the beginning, or past the end
        return reader
    try:
        reader.seek(LocalMessageID(target), inclusive=include)
    except DataLossError:
        reader.seek(LocalMessageID(-1), inclusive=True)  # truncated: the oldest retained entry
    return reader


def _add(scan: Scan, m) -> None:
    props = dict(m.properties)
    entry = (m.id.offset, bytes(m.payload), props)
    if "_v" not in props:  # a pre-upgrade 2.5 entry: served as a version-0 message
        old = scan.old.rebuild(m.id.offset, entry[1], props)
        if old is None:  # no 2.5 message (an opaque payload): passes through in log order
            key = scan.buffer[-1].tt if scan.buffer else scan.last_tick
            scan.buffer.append(Unit(key, [entry], raw_tt=m.timestamp or 0))
            return
        tt, props = old
        if not props:  # Milvus does not know its vchannel: skipped
            return
        if props["_t"] == old_version.TIME_TICK:
            release(scan, tt)
        else:
            scan.buffer.append(Unit(tt, [(m.id.offset, entry[1], props)]))
        return
    t, tt = props.get("_t"), int(props.get("_tt", "0"), 36)
    if t == "1":
        release(scan, tt)
        return
    txn = _txn_id(props)
    if txn is not None and t == "900":
        scan.txns[txn] = [entry]
    elif txn is not None and txn in scan.txns and t not in ("901", "902"):
        scan.txns[txn].append(entry)
    elif txn is not None and t == "901" and txn in scan.txns:
        group = scan.txns.pop(txn) + [entry]
        lc = props.get("_lc")
        for _, _, p in group:
            p["_tt"] = props["_tt"]
            p.pop("_lcs", None)
            if lc is not None:
                p["_lc"] = lc
        scan.buffer.append(Unit(tt, group))
    elif txn is not None:
        scan.txns.pop(txn, None) if t == "902" else None  # rollback, or a member whose Begin we never saw
    elif t not in FILTERED:
        scan.buffer.append(Unit(tt, [entry]))


def release(scan: Scan, tick: int) -> list[Unit]:
    """Units released by a tick at ``tick``, sorted by ``_tt``, bounded by the request's ticks."""
    ready = [u for u in scan.buffer if u.tt <= tick or u.raw_tt is not None]
    scan.buffer = [u for u in scan.buffer if not (u.tt <= tick or u.raw_tt is not None)]
    out = []
    for u in sorted(ready, key=lambda u: u.tt):
        if u.raw_tt is None and u.tt < scan.last_tick:
            continue  # time-tick violation
        tt = u.tt if u.raw_tt is None else u.raw_tt
        if scan.end_tt and tt > scan.end_tt:
            scan.ended = True
            break
        if tt >= scan.start_tt:
            out.append(u)
    scan.last_tick = max(scan.last_tick, tick)
    if scan.end_tt and tick > scan.end_tt:
        scan.ended = True
    scan.pending += out
    return out


def write_tick(store: LocalClient, pchannel: str) -> int:
    """Persist a TimeTick at the current TSO, as Milvus's scanner does when a scan starts: its id."""
    from msgstream_spark.mq.base import ProducerMessage
    from tests.wal26 import producer as P

    tick = P.timetick(tso_now(), lcs=True)
    with store.create_producer(pchannel) as p:
        return p.send(ProducerMessage(tick.payload, tick.properties, tick.tt)).offset


def dump(store: LocalClient, pchannel: str, start_id: str, wal_name: int, include: bool, start_tt: int,
         end_tt: int, active: Callable[[], bool], poll: float = 0.02,
         write_ticks: bool = True, lock=None,
         vchannel_of: Callable[[int, str], str | None] = lambda cid, pch: None) -> Iterator[tuple[int, bytes, dict]]:
    """Yield ``(id, payload, properties)`` as Milvus's proxy sends them, until ``end_tt`` or cancel. ``lock``:
    held while the scan's TimeTick is allocated and written (the test's writers hold it too). ``vchannel_of``:
    a collection's vchannel on a pchannel, from the cluster's metadata (for version-0 DDL entries)."""
    check_request(pchannel, start_id, start_tt, end_tt)
    if not store.channel_exists(pchannel):  # an unknown pchannel: open and silent until cancelled
        while active():
            time.sleep(poll)
        return
    if write_ticks:
        with lock if lock is not None else contextlib.nullcontext():  # no write lands below this tick
            write_tick(store, pchannel)
    reader = open_reader(store, pchannel, start_id, wal_name, include)
    scan = Scan(start_tt, end_tt, old_version.OldVersion(pchannel, vchannel_of))
    try:
        while active() and not scan.ended:
            batch = reader.receive_batch(1000, 0.0 if scan.buffer else poll)
            for m in batch:
                _add(scan, m)
            if not batch:  # caught up: a tick with the current TSO follows the stored entries
                release(scan, max(tso_now(), scan.last_tick))
            out, scan.pending = scan.pending, []
            for unit in out:
                yield from unit.entries
    finally:
        reader.close()
