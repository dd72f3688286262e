"""The time-tick cut planner: where a set of channels can end a batch (wire doc §7.4).

A batch of aligned channels ends at a time tick T every aligned channel with pending data has
reached, so it holds complete MsgPacks. Both consumers of the rule use it: ``TtMsgStream``
(blocking, over decoded messages) through :func:`common_tick` and :func:`split_at`, and the Spark
streaming source (over a scan of message headers) through :func:`plan_cut`, which also applies
row/byte budgets. Pure functions over plain data: no backend, no Spark.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass
class Item:
    """One scanned message: its id, timestamp, tick flag, and the rows and bytes it contributes."""

    id: Any
    ts: int
    tick: bool
    rows: int
    size: int


def common_tick(last_ticks: Iterable[int]) -> int:
    """The tick every channel has reached: the lowest of their last ticks."""
    return min(last_ticks)


def split_at(msgs: Sequence[Any], t: int) -> tuple[list[Any], list[Any]]:
    """(messages with EndTs <= t, the rest), each in channel order."""
    return [m for m in msgs if m.end_ts <= t], [m for m in msgs if m.end_ts > t]


def tick_bound(views: Mapping[str, Sequence[Item]], aligned: Iterable[str], start_ts: Mapping[str, int]) -> float:
    """The highest tick every aligned channel with pending (non-tick-ended) data reached."""
    bound = math.inf
    for ch in aligned:
        items = views[ch]
        if items and not items[-1].tick:
            ticks = [it.ts for it in items if it.tick]
            bound = min(bound, ticks[-1] if ticks else start_ts.get(ch, 0))
    return bound


def cut_at(views: Mapping[str, Sequence[Item]], aligned: Iterable[str], t: float) -> dict[str, int]:
    """Items taken per aligned channel (a count from the front) when cutting at tick ``t``."""
    out = {}
    for ch in aligned:
        last = -1
        for i, it in enumerate(views[ch]):
            if it.tick and it.ts <= t:
                last = i
        out[ch] = last + 1
    return out


def totals(views: Mapping[str, Sequence[Item]], taken: Mapping[str, int]) -> tuple[int, int]:
    """(rows, bytes) of the first ``taken[ch]`` items of each channel."""
    rows = sum(it.rows for ch, n in taken.items() for it in views[ch][:n])
    size = sum(it.size for ch, n in taken.items() for it in views[ch][:n])
    return rows, size


def _aligned_cut(views: Mapping[str, Sequence[Item]], aligned: set[str], start_ts: Mapping[str, int],
                 max_rows: int | None, max_bytes: int | None) -> dict[str, int]:
    bound = tick_bound(views, aligned, start_ts)
    candidates = sorted({it.ts for ch in aligned for it in views[ch] if it.tick and it.ts <= bound})
    if not candidates:
        return {ch: 0 for ch in aligned}
    if not (max_rows or max_bytes):
        return cut_at(views, aligned, candidates[-1])
    chosen = cut_at(views, aligned, candidates[0])  # always at least one step of progress
    for t in candidates[1:]:
        idx = cut_at(views, aligned, t)
        r, b = totals(views, idx)
        if (max_rows and r > max_rows) or (max_bytes and b > max_bytes):
            break
        chosen = idx
    return chosen


def _take_within(items: Sequence[Item], share_rows: int | None, share_bytes: int | None) -> int:
    """How many items fit a share of the budget (at least one)."""
    r = b = take = 0
    for it in items:
        if take > 0 and ((share_rows is not None and r + it.rows > share_rows) or
                         (share_bytes is not None and b + it.size > share_bytes)):
            break
        r += it.rows
        b += it.size
        take += 1
    return take


def plan_cut(views: Mapping[str, Sequence[Item]], aligned: set[str], start_ts: Mapping[str, int], *,
             max_rows: int | None = None, max_bytes: int | None = None) -> tuple[dict[str, int], int]:
    """Items to take per channel and the rows they hold.

    Aligned channels end at the last tick with ts <= T (:func:`tick_bound`); with row/byte caps
    the largest such cut within budget (always at least one step). Unaligned channels go by
    message, sharing what is left of the budget in order.
    """
    chosen = _aligned_cut(views, aligned, start_ts, max_rows, max_bytes)
    used_rows, used_bytes = totals(views, chosen)
    free = [ch for ch in views if ch not in aligned and views[ch]]
    for n, ch in enumerate(free):
        items = views[ch]
        take = len(items)
        if max_rows or max_bytes:
            left = len(free) - n
            share_r = None if not max_rows else max(0, max_rows - used_rows) // left
            share_b = None if not max_bytes else max(0, max_bytes - used_bytes) // left
            take = _take_within(items, share_r, share_b)
        r, b = totals(views, {ch: take})
        used_rows += r
        used_bytes += b
        chosen[ch] = take
    return chosen, used_rows
