"""Which id ranges a batch reads: one per channel with data, split for ``minPartitions``.

Pyspark-free (the partitions wrap these ranges), so the rule is unit-tested without Spark.
A range is split only where the backend says its ids are integer offsets
(``Client.message_id_from_offset``); nothing here knows backend names or id layouts.
"""

from __future__ import annotations

from typing import Any

from msgstream_spark.source.offsets import ChannelOffset, Offset

Range = tuple[str, ChannelOffset, ChannelOffset]


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


def _span(client: Any, s: ChannelOffset, e: ChannelOffset) -> tuple[int, int] | None:
    """(first, last) integer offsets of an exclusive-start, inclusive-end range, if splittable."""
    if not s.msg_id or s.inclusive or e.exclusive:
        return None
    a = client.bytes_to_message_id(s.msg_id).offset
    b = client.bytes_to_message_id(e.msg_id).offset
    if a is None or b is None or client.message_id_from_offset(a) is None:
        return None
    return a, b


def plan_ranges(client: Any, start: Offset, end: Offset, min_partitions: int | None) -> list[Range]:
    """The ranges to read; with ``min_partitions`` above the channel count, large ranges are cut
    into pieces proportional to their size (exclusive start, inclusive end each)."""
    ranges = channel_ranges(start, end)
    want = min_partitions or 0
    if want <= len(ranges):
        return ranges
    spans = {ch: sp for ch, s, e in ranges if (sp := _span(client, s, e)) is not None}
    total = sum(max(0, b - a) for a, b in spans.values()) or 1
    out: list[Range] = []
    for ch, s, e in ranges:
        size = max(0, spans[ch][1] - spans[ch][0]) if ch in spans else 0
        pieces = max(1, min(size, round(want * size / total))) if size > 1 else 1
        if pieces == 1:
            out.append((ch, s, e))
            continue
        a, b = spans[ch]
        bounds = [a + (b - a) * k // pieces for k in range(pieces + 1)]
        for lo, hi in zip(bounds, bounds[1:]):
            if hi > lo:
                ps = ChannelOffset(client.message_id_from_offset(lo).serialize(), 0)
                pe = ChannelOffset(client.message_id_from_offset(hi).serialize(), e.ts if hi == b else 0)
                out.append((ch, ps, pe))
    return out
