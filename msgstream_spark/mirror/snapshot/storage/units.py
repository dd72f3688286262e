"""Which insert binlogs one Spark task reads together, and whether a key can be kept twice across tasks.

A key is kept in at most one row (the newest ``_seq``). Milvus routes every row of a key to one vchannel
(the proxy hashes the primary key over the collection's channels: ``typeutil.HashPK2Channels``, used for
insert, delete and upsert in ``internal/proxy``), so two rows of a key are on one channel, in one segment
or in two segments of that channel (a re-insert of an existing key). Each segment's primary-key stats log
(``PrimaryKeyStats`` JSON of ``internal/storage/stats.go``: ``minPk`` / ``maxPk`` of every row it holds)
bounds its keys. Segments of one channel whose bounds overlap (or that have no stats log) form one
*unit*: a unit's rows are read by one task, which keeps one row per key itself (column-wise: a sort by
key and ``_seq``). Units hold disjoint key sets, so no second pass over the keys is needed, and the task
checks the bounds against the keys it reads (a key outside its segment's stats fails the read, never a
duplicate). A unit above ``max_unit_rows`` rows (many segments of a channel re-inserting one key range)
is read segment by segment instead, and a key pass over its segments (Spark) finds the keys they share.
Units are packed into at most ``max(parallelism, bytes / task_bytes)`` tasks (largest first, each to the
lightest task), so a small snapshot runs as many tasks as there are cores, not one per binlog.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.snapshot.storage.access import StorageSettings, read_bytes
from msgstream_spark.mirror.snapshot.storage.plan import ReadTask, StoragePlan
from msgstream_spark.mirror.store import Store

TASK_BYTES = 256 << 20  # binlog bytes per Spark task before more tasks than cores are planned
MAX_UNIT_ROWS = 20_000_000  # above it a unit's key sets are reconciled by a key pass (keys + _seq in memory)
ROW_WEIGHT = 64  # the weight of a row where etcd gives no file size


@dataclass(frozen=True)
class Bounds:
    """A segment's smallest and largest primary key (from its stats logs); ``None``: unknown."""

    lo: int | str | None = None
    hi: int | str | None = None

    @property
    def known(self) -> bool:
        return self.lo is not None and self.hi is not None


@dataclass
class Unit:
    """Binlog groups read by one task; ``bounds``: segment -> the keys its stats log allows."""

    tasks: list[ReadTask]
    bounds: dict[int, Bounds] = field(default_factory=dict)

    @property
    def rows(self) -> int:
        return sum(t.rows for t in self.tasks)

    @property
    def weight(self) -> int:
        return sum(t.size or t.rows * ROW_WEIGHT for t in self.tasks)


@dataclass
class Packing:
    """The Spark tasks (each a list of units) and the binlog groups a key pass must cover first."""

    tasks: list[list[Unit]]
    key_pass: list[ReadTask]


def _stats_bounds(data: bytes, where: str) -> Bounds:
    """``PrimaryKeyStats`` JSON (one object, or a list in the compound log) -> its key bounds."""
    try:
        doc = json.loads(data)
    except ValueError as exc:
        raise MirrorError(f"stats log {where} is not JSON (a PrimaryKeyStats): {exc}") from exc
    lo = hi = None
    for s in doc if isinstance(doc, list) else [doc]:
        if not isinstance(s, dict):
            return Bounds()
        a, b = s.get("minPk", s.get("min")), s.get("maxPk", s.get("max"))
        if isinstance(a, dict):  # a writer that wraps the key
            a, b = a.get("pk"), (b or {}).get("pk")
        if a is None or b is None:
            return Bounds()
        lo = a if lo is None or a < lo else lo
        hi = b if hi is None or b > hi else hi
    return Bounds(lo, hi)


def read_bounds(settings: StorageSettings, plan: StoragePlan, store: Store | None = None) -> dict[int, Bounds]:
    """segment -> its key bounds, from the plan's stats logs (driver side: a few small JSON files per segment;
    ``store``: Milvus's, default one made from ``settings``)."""
    milvus = store if store is not None else settings.store()
    out: dict[int, Bounds] = {}
    for seg in plan.segments:
        paths = plan.stats.get(seg, [])
        parts = [_stats_bounds(read_bytes(settings, p, seg, milvus), p) for p in paths]
        if not parts or not all(b.known for b in parts):
            out[seg] = Bounds()
            continue
        out[seg] = Bounds(min(b.lo for b in parts), max(b.hi for b in parts))
    return out


def _components(segs: list[int], bounds: dict[int, Bounds]) -> list[list[int]]:
    """Segments of one channel grouped where their key bounds overlap (an unknown bound overlaps all)."""
    unknown = [s for s in segs if not bounds.get(s, Bounds()).known]
    known = sorted((s for s in segs if s not in unknown), key=lambda s: bounds[s].lo)
    if unknown:
        return [unknown + known]
    out: list[list[int]] = []
    hi = None
    for s in known:
        if out and bounds[s].lo <= hi:
            out[-1].append(s)
            hi = max(hi, bounds[s].hi)
        else:
            out.append([s])
            hi = bounds[s].hi
    return out


def pack(plan: StoragePlan, bounds: dict[int, Bounds], parallelism: int, task_bytes: int = TASK_BYTES,
         max_unit_rows: int = MAX_UNIT_ROWS) -> Packing:
    """The plan's binlog groups as units packed into Spark tasks (see the module's doc)."""
    by_seg: dict[int, list[ReadTask]] = {}
    channel: dict[int, str] = {}
    for t in plan.tasks:
        by_seg.setdefault(t.segment, []).append(t)
        channel[t.segment] = t.channel
    units, key_pass = [], []
    for ch in sorted(set(channel.values())):
        for comp in _components([s for s in by_seg if channel[s] == ch], bounds):
            unit = Unit([t for s in comp for t in by_seg[s]], {s: bounds.get(s, Bounds()) for s in comp})
            if len(comp) > 1 and unit.rows > max_unit_rows:
                key_pass += unit.tasks
                units += [Unit(by_seg[s], {s: bounds.get(s, Bounds())}) for s in comp]
            else:
                units.append(unit)
    total = sum(u.weight for u in units)
    n = max(1, min(len(units), max(parallelism, math.ceil(total / max(1, task_bytes)))))
    bins: list[list[Unit]] = [[] for _ in range(n)]
    loads = [0] * n
    for u in sorted(units, key=lambda u: -u.weight):
        i = loads.index(min(loads))
        bins[i].append(u)
        loads[i] += u.weight
    return Packing([b for b in bins if b] or [[]], key_pass)  # no row at all: one task writes the empty file
