"""Which id ranges a read takes: one per channel with data, cut for ``minPartitions`` and
``maxRecordsPerPartition`` (named and meant as in Spark's Kafka source).

Pyspark-free (Spark's partitions wrap these ranges), so the rule is unit-tested without Spark.
A range is cut only where the backend says its ids are integer offsets
(``Client.message_id_from_offset``); nothing here knows backend names or id layouts.

Where a cut goes (a piece ends with the message at the cut, the next starts after it):

* 2.5 messages carry no state from one to the next: any message will do.
* 2.6 (WAL) messages: only right after a TimeTick for every vchannel (no ``_vc``). A reader drops a
  WAL message whose ``_tt`` is below the last TimeTick it saw (Milvus's time-tick-violation rule),
  so the next piece starts with that tick's ``_tt`` as its last tick (``tick`` in its start entry):
  the state the unsplit read has there, TimeTicks being monotonic on a pchannel. Transactions
  straddling the cut need nothing from the planner: a piece that ends inside one reads on to its
  end and keeps its rows, the next piece ignores its bodies (it never saw the Begin).
* A range that starts AT a position (Milvus's seek filter) gives its filter's time to every piece
  (``seekTs``): a later piece drops what the unsplit read would still drop (up to the first
  TimeTick at or after that time; after it, TimeTicks guarantee nothing older follows).

The planner finds each cut by reading a few messages from the proportional offset on (at most
:data:`CUT_WINDOW`); where none qualifies, the two pieces stay one. With option ``dedupe`` a range
is never cut (the replay filter's state spans the whole range).
"""

from __future__ import annotations

import math
from typing import Any

from msgstream_spark.msg.wal26 import WalMessageType, b36decode, is_wal_message
from msgstream_spark.source.offsets import ChannelOffset, Offset

Range = tuple[str, ChannelOffset, ChannelOffset]
Piece = tuple[str, dict, dict]  # (channel, start entry, end entry) with the cut's extra keys

CUT_WINDOW = 256  # messages read past a proportional cut to find a safe one
_CUT_FETCH = 16


def channel_ranges(start: Offset, end: Offset) -> list[Range]:
    """(channel, start, end) of every channel with something in (start, end], sorted by channel."""
    out = []
    for ch in sorted(end):
        s = ChannelOffset.from_json(start.get(ch, {}))
        e = ChannelOffset.from_json(end[ch])
        if not e.msg_id or (s.msg_id == e.msg_id and not s.inclusive):
            continue
        out.append((ch, s, e))
    return out


def _span(client: Any, ch: str, s: ChannelOffset, e: ChannelOffset) -> tuple[int, int] | None:
    """(a, b): the range holds offsets a+1 .. b, when the backend's ids are offsets."""
    end = client.bytes_to_message_id(e.msg_id).offset
    if end is None or client.message_id_from_offset(end) is None:
        return None
    b = end - 1 if e.exclusive else end
    if not s.msg_id:  # from the channel's first message
        first = client.first_message_id(ch)
        a = None if first is None or first.offset is None else first.offset - 1
    else:
        a = client.bytes_to_message_id(s.msg_id).offset
        a = None if a is None else a - 1 if s.inclusive else a
    return None if a is None or b <= a else (a, b)


def _pieces(size: int, share: int, max_records: int | None) -> int:
    n = max(share, math.ceil(size / max_records) if max_records else 1)
    return max(1, min(size, n))


def plan_ranges(client: Any, start: Offset, end: Offset, min_partitions: int | None,
                max_records: int | None = None, *, dedupe: bool = False) -> list[Piece]:
    """The pieces to read, in channel order and in order within a channel.

    With ``min_partitions`` above the channel count, ranges are cut into pieces proportional to
    their size; with ``max_records``, no piece holds more than that many messages (as planned: a
    cut moves to the next safe message). Each piece's start and end are offset entries; a cut
    piece's start may carry ``tick`` and ``seekTs`` (see the module's doc).
    """
    ranges = channel_ranges(start, end)
    whole = [(ch, s.to_json(), e.to_json()) for ch, s, e in ranges]
    want = min_partitions or 0
    if dedupe or (want <= len(ranges) and not max_records):
        return whole
    spans = {ch: sp for ch, s, e in ranges if (sp := _span(client, ch, s, e)) is not None}
    total = sum(b - a for a, b in spans.values()) or 1
    out: list[Piece] = []
    for (ch, s, e), w in zip(ranges, whole):
        if ch not in spans:
            out.append(w)
            continue
        a, b = spans[ch]
        share = round(want * (b - a) / total) if want > len(ranges) else 1
        n = _pieces(b - a, share, max_records)
        out.extend(_cut(client, ch, s, e, a, b, n) if n > 1 else [w])
    return out


def _cut(client: Any, ch: str, s: ChannelOffset, e: ChannelOffset, a: int, b: int, n: int) -> list[Piece]:
    """The range (a, b] of ``ch`` in up to ``n`` pieces, each cut moved to a safe message."""
    cuts: list[tuple[int, int | None]] = []
    lo = a
    for k in range(1, n):
        target = max(a + (b - a) * k // n, lo + 1)
        if target >= b:
            break
        found = _safe_cut(client, ch, target, b)
        if found is None or found[0] <= lo or found[0] >= b:
            continue
        cuts.append(found)
        lo = found[0]
    if not cuts:
        return [(ch, s.to_json(), e.to_json())]
    seek = {"seekTs": s.ts} if s.inclusive and s.ts else {}
    pieces: list[Piece] = []
    first = s.to_json()
    for off, tick in cuts:
        cut_id = client.message_id_from_offset(off).serialize()
        pieces.append((ch, first, ChannelOffset(cut_id, 0).to_json()))
        first = {**ChannelOffset(cut_id, 0).to_json(), **seek, **({"tick": tick} if tick is not None else {})}
    pieces.append((ch, first, e.to_json()))
    return pieces


def _safe_cut(client: Any, ch: str, target: int, b: int) -> tuple[int, int | None] | None:
    """(offset of the first message at or after ``target`` a piece may end with, the WAL tick to seed
    the next piece with), looking at most :data:`CUT_WINDOW` messages and not past offset ``b``."""
    reader = client.reader(ch)
    try:
        reader.seek(client.message_id_from_offset(target), inclusive=True)
        seen = 0
        while seen < CUT_WINDOW:
            batch = reader.receive_batch(_CUT_FETCH, 5.0)
            if not batch:
                return None
            for m in batch:
                off = m.id.offset
                if off is None or off >= b:
                    return None
                props = m.properties or {}
                if not is_wal_message(props):
                    return off, None  # a 2.5 message (version 0 too): nothing carries over
                if props.get("_t") == str(int(WalMessageType.TimeTick)) and not props.get("_vc"):
                    try:
                        return off, b36decode(props.get("_tt", ""))
                    except ValueError:
                        pass  # a malformed tick is not a cut (the read task reports it)
            seen += len(batch)
        return None
    finally:
        reader.unsubscribe()


# -- several small ranges in one task ------------------------------------------------------------------
PACK_MESSAGES = 2048  # below this many messages a range shares its task with others (a task's fixed cost)
MIN_TASKS = 2  # packing keeps at least this many tasks (or minPartitions), so that two cores stay busy


def piece_size(client: Any, ch: str, start: dict, end: dict) -> int | None:
    """Messages in a planned piece (ids that are offsets), else None."""
    sp = _span(client, ch, ChannelOffset.from_json(start), ChannelOffset.from_json(end))
    return None if sp is None else sp[1] - sp[0]


def pack(sizes: list[int | None], min_tasks: int = MIN_TASKS) -> list[list[int]]:
    """Group piece indexes into tasks: a piece of unknown size or of :data:`PACK_MESSAGES` or more keeps
    its own task; the small ones share tasks of about equal size, at least ``min_tasks`` of them (fewer
    only when there are fewer small pieces), more when they add up past ``PACK_MESSAGES`` a task.

    Many small channels (Milvus's 16 DML channels of a modest log) then cost a few tasks, not one each;
    indexes stay in order within a task (a channel's pieces are read in order by one task or by several).
    """
    alone = [[i] for i, n in enumerate(sizes) if n is None or n >= PACK_MESSAGES]
    small = [i for i, n in enumerate(sizes) if n is not None and n < PACK_MESSAGES]
    total = sum(sizes[i] or 0 for i in small)
    groups = min(len(small), max(min_tasks, -(-total // PACK_MESSAGES)))
    if groups >= len(small):
        return sorted(alone + [[i] for i in small])
    loads = [0] * groups
    members: list[list[int]] = [[] for _ in range(groups)]
    for i in sorted(small, key=lambda i: -(sizes[i] or 0)):  # largest first onto the least loaded
        g = loads.index(min(loads))
        members[g].append(i)
        loads[g] += max(1, sizes[i] or 0)
    return sorted(alone + [sorted(m) for m in members if m])
