"""A first schema scan bounded by a message budget: the channel's newest messages first (issue #24).

Without a stored scan (:mod:`msgstream_spark.source.scancache`), schema inference read each channel
from its first retained message: a first plan cost a fetch of the whole log. Where message ids are
integer offsets (``Client.message_id_from_offset``: Kafka, the embedded log) and a channel holds more
messages than the budget (option ``schemaScanMessages``, default 512; 0: no bound), the scan reads
windows of :data:`TAIL_WINDOW` messages backwards
from the channel's latest one, each window forwards, and stops at the first (newest) window holding a
message that carries a schema of a wanted collection (CreateCollection; 2.6 AlterCollection /
SchemaChange). Within that window the newest such message wins, as in a scan from the start.

When the budget runs out first, the schema comes from the newest window's inserts (source ``Insert``):
an insert's FieldData tells names, types, the primary key and vector dimensions, not what only the
collection's schema says (nullability and defaults, a field absent from every insert of the window,
function outputs such as BM25 sparse vectors, the names inside struct arrays, the description).
Give ``schema`` to read such a collection exactly.

What the bounded scan cannot see: a collection whose messages all lie before the windows read (with no
``collection`` option, "several collections" is judged on what was read). Pulsar's ids are not offsets,
but a ledger's entries are numbered without gaps: there the scan reads one window, the newest ``budget``
entries of the last message's ledger (:func:`start_before`, :func:`scan_from`; Milvus's producers do not
batch, so an entry is a message). A Pulsar channel whose newest ledger is shorter than the budget (just
after a ledger rollover), the ``milvus`` proxy's channels and short channels are read from their first
message as before.

Looking further back (:func:`look_back`, option ``schemaLookback``, default :data:`LOOKBACK`): when the first
window holds no message of the wanted collection (on a busy channel shared with other collections its
CreateCollection and inserts may all lie before it), the scan goes on backwards over the older messages, each
step as many as all read so far (the total doubles: 512, 1024, 2048, ...), until one holds a message of it or
the lookback's total is read (``0``: no bound, back to the channel's first message). Pulsar: the doubled
windows are re-read from the newest entry inside the last message's ledger; once a window would outgrow the
ledger, the channel is read from its first message (as a channel whose newest ledger is shorter than the
budget always is).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from msgstream_spark.msg.wal26 import is_wal_message

TAIL_WINDOW = 4096  # messages read per window (the default budget is one window: one seek)
LOOKBACK = 65536  # option schemaLookback's default: the most messages per channel a first inference reads

Notes = tuple[dict, dict, set, dict]  # found, created, broadcasts seen, stamps (time of the schema message)
Feed = Callable[[str, list, Notes], None]


def span(client: Any, ch: str, last: Any, budget: int) -> tuple[int, int] | None:
    """(first, last) offsets of ``ch`` when a scan bounded by ``budget`` messages applies to it, else ``None``."""
    if budget <= 0 or client.message_id_from_offset(0) is None:
        return None  # ids are not offsets: no window can be addressed
    first = client.first_message_id(ch)
    if first is None or last.offset - first.offset + 1 <= budget:
        return None
    return first.offset, last.offset


def _read_window(cons: Any, ch: str, start: Any, last: Any, want: int, feed: Feed, notes: Notes,
                 deadline: float) -> int:
    """Feed the messages from id ``start`` to id ``last`` (both included, about ``want`` of them) in order;
    how many were fetched."""
    cons.seek(start, inclusive=True)
    fetched = 0
    while time.monotonic() < deadline:
        batch = cons.receive_batch(max(1, min(1024, want - fetched)), 0.2)
        if not batch:
            continue  # a slow first fetch: wait, within the deadline
        fetched += len(batch)
        inside = [m for m in batch if not last < m.id]
        feed(ch, inside, notes)
        if len(inside) < len(batch) or not batch[-1].id < last:
            break
    return fetched


def scan_tail(client: Any, ch: str, span: tuple[int, int], budget: int, feed: Feed,
              deadline: float) -> tuple[Notes, int]:
    """The notes of the newest window that holds a schema message (else of the newest one with any
    note, inserts), and how many messages were fetched in all (at most ``budget``)."""
    first, last = span
    fallback: Notes | None = None
    fetched, top = 0, last
    cons = client.reader(ch)
    try:
        while fetched < budget and top >= first and time.monotonic() < deadline:
            bottom = max(first, top - min(TAIL_WINDOW, budget - fetched) + 1)
            notes: Notes = ({}, {}, set(), {})
            fetched += _read_window(cons, ch, client.message_id_from_offset(bottom), client.message_id_from_offset(top),
                                    top - bottom + 1, feed, notes, deadline)
            if any(src != "Insert" for _, src in notes[0].values()):
                return notes, fetched
            if fallback is None and notes[0]:
                fallback = notes
            top = bottom - 1
    finally:
        cons.unsubscribe()  # a throwaway inference subscription
    return fallback or ({}, {}, set(), {}), fetched


def start_before(client: Any, ch: str, last: Any, budget: int) -> Any:
    """For ids that are not offsets: an id ``budget`` messages before ``last`` (``Client.id_before``: Pulsar,
    within ``last``'s ledger) when a bounded scan applies, else ``None``."""
    if budget <= 0 or client.message_id_from_offset(0) is not None:
        return None
    return client.id_before(last, budget)


def scan_from(client: Any, ch: str, start: Any, last: Any, feed: Feed, deadline: float) -> tuple[Notes, int]:
    """One window, ``start`` to ``last`` (both included), read forwards: its notes (a schema message's, or
    the inserts' when it holds none) and how many messages were fetched."""
    notes: Notes = ({}, {}, set(), {})
    cons = client.reader(ch)
    try:
        fetched = _read_window(cons, ch, start, last, 1 << 30, feed, notes, deadline)
    finally:
        cons.unsubscribe()  # a throwaway inference subscription
    return notes, fetched


def _next_step(total: int, limit: int) -> int:
    """How many older messages the next lookback step reads: as many as read so far, within ``limit``."""
    return max(1, total if limit <= 0 else min(total, limit - total))


def look_back(client: Any, ch: str, span: tuple[int, int], budget: int, limit: int, feed: Feed,
              deadline: float) -> tuple[Notes, int]:
    """:func:`scan_tail` of the newest ``budget`` messages, then, while none of them told a wanted collection's
    schema, of the older ones in steps that double the total read, up to ``limit`` messages (0: no bound)."""
    first, top = span
    step = budget
    notes, fetched = scan_tail(client, ch, (first, top), step, feed, deadline)
    total, covered = fetched, step
    while not notes[0] and top - step >= first and (limit <= 0 or covered < limit) and time.monotonic() < deadline:
        top -= step  # the older messages, below the ones read
        step = _next_step(covered, limit)
        notes, fetched = scan_tail(client, ch, (first, top), step, feed, deadline)
        total, covered = total + fetched, covered + step
    return notes, total


def look_back_from(client: Any, ch: str, start: Any, last: Any, budget: int, limit: int, feed: Feed,
                   deadline: float) -> tuple[Notes, int, bool]:
    """:func:`scan_from` for ids that are not offsets, the window doubled (re-read from ``last``) while it tells
    no wanted schema, up to ``limit`` messages and within ``last``'s ledger (``Client.id_before``): the notes,
    how many messages were fetched, and whether the window outgrew the ledger before the limit (the older
    messages are in an earlier ledger, which no id addresses without reading from the channel's start)."""
    notes, fetched = scan_from(client, ch, start, last, feed, deadline)
    total, size = fetched, budget
    while not notes[0] and (limit <= 0 or size < limit) and time.monotonic() < deadline:
        size = size * 2 if limit <= 0 else min(size * 2, limit)
        start = client.id_before(last, size)
        if start is None:
            return notes, total, True
        notes, fetched = scan_from(client, ch, start, last, feed, deadline)
        total += fetched
    return notes, total, False


def ends_in_25(cons: Any, last: Any) -> bool:
    """Whether message ``last`` of the channel is a 2.5 one (its writers moved to 2.6 messages after it, if ever,
    so everything before it back to where a scan stopped is 2.5 as well); False when it does not come."""
    cons.seek(last, inclusive=True)
    got = cons.receive_batch(1, 1.0)
    return bool(got) and got[0].id == last and not is_wal_message(got[0].properties)


def _take(acc: Notes, got: Notes, cids) -> None:
    """``got``'s notes of the collections ``cids`` into ``acc`` (replacing what ``acc`` noted of them)."""
    for cid in cids:
        acc[0][cid] = got[0][cid]
        for part in (acc[1], acc[3]):
            part.pop(cid, None)
        for part, theirs in ((acc[1], got[1]), (acc[3], got[3])):
            if cid in theirs:
                part[cid] = theirs[cid]
    acc[2].update(got[2])


def scan_tail_each(client: Any, ch: str, span: tuple[int, int], budget: int, feed: Feed, deadline: float,
                   wanted: frozenset) -> tuple[Notes, int]:
    """:func:`scan_tail` of several collections (ids ``wanted``) at once, over the same windows: per collection
    the notes of the newest window holding a schema message of it, else of the newest holding its inserts; the
    windows are read until each has its schema message or the budget is spent."""
    first, last = span
    told: Notes = ({}, {}, set(), {})
    inserts: Notes = ({}, {}, set(), {})
    fetched, top = 0, last
    cons = client.reader(ch)
    try:
        while fetched < budget and top >= first and time.monotonic() < deadline:
            bottom = max(first, top - min(TAIL_WINDOW, budget - fetched) + 1)
            notes: Notes = ({}, {}, set(), {})
            fetched += _read_window(cons, ch, client.message_id_from_offset(bottom), client.message_id_from_offset(top),
                                    top - bottom + 1, feed, notes, deadline)
            _take(told, notes, [c for c, (_, src) in notes[0].items() if src != "Insert" and c not in told[0]])
            _take(inserts, notes, [c for c in notes[0] if c not in inserts[0]])
            if wanted <= told[0].keys():
                break
            top = bottom - 1
    finally:
        cons.unsubscribe()  # a throwaway inference subscription
    _take(inserts, told, list(told[0]))  # a schema message's notes over the inserts'
    return inserts, fetched


def look_back_each(client: Any, ch: str, span: tuple[int, int], budget: int, limit: int, feed: Feed,
                   deadline: float, wanted: frozenset) -> tuple[Notes, int]:
    """:func:`look_back` of several collections (ids ``wanted``) at once, over the same windows: per collection
    the notes of the first step that told anything of it (what its own :func:`look_back` returns), the steps
    going on while one of them is still untold, up to ``limit`` messages."""
    first, top = span
    step = budget
    acc: Notes = ({}, {}, set(), {})
    got, total = scan_tail_each(client, ch, (first, top), step, feed, deadline, wanted)
    _take(acc, got, list(got[0]))
    covered = step
    while (not wanted <= acc[0].keys() and top - step >= first and (limit <= 0 or covered < limit)
           and time.monotonic() < deadline):
        top -= step
        step = _next_step(covered, limit)
        got, fetched = scan_tail_each(client, ch, (first, top), step, feed, deadline, wanted)
        _take(acc, got, [c for c in got[0] if c not in acc[0]])
        total, covered = total + fetched, covered + step
    return acc, total
