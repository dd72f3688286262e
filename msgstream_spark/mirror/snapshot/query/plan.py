"""The snapshot's plan: cuts in key space where the rows are, from about one call per cut.

Spark-free. A range of keys (a partition, or one task's share) is cut into pieces of about ``want`` rows.
How the rows spread over the keys is known at a few points (key, rank), rank being the rows below the key
in the range: a ``count(*)`` of ``pk < x`` gives one point, a ``limit`` query from a key gives many (Milvus
answers it with the smallest keys, in key order: :meth:`Querier.smallest_keys`). The search starts where
the keys are (the range's smallest keys, one ``limit`` query, when it is open on either side), then finds
each cut by guessing the key at the cut's rank and counting it:

* between two known points around the rank, by interpolating their keys (uniform keys: one count a cut);
* above every known point, by extrapolating the density seen so far (a little past it, more after each
  count that falls short: the largest key is never needed, the last piece is open);
* where two counts in a row land on the same side (clustered or skewed keys), by a ``limit`` query from
  the bracket's lower point, which lands on the next keys past a gap and gives the local density, then by
  the key-space midpoint (:func:`ranges.midpoint`).

A cut is taken when its rank is within ``tolerance`` x ``want`` of the target, or after ``MAX_STEPS``
calls the nearest found. The ranks only size the pieces: the pieces cover the range exactly whatever
the counts say, so rows written or deleted during the plan (a growing collection) change the pieces'
sizes, never which rows are read. VarChar keys are interpolated as numbers written in the characters
seen in keys so far (a character between two seen ones gets the digit between theirs), so keys spelled
with a few of Unicode's characters (``doc_000123``, hex ids) spread over the numbers as over the ranks.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterator
from dataclasses import replace
from typing import Any, Protocol

from msgstream_spark.mirror.snapshot.query.ranges import INT64_MAX, INT64_MIN, PkRange, midpoint

K = 256  # keys a ``limit`` query of the plan asks for (a few ms on 2.3.5, like a count)
MAX_STEPS = 24  # calls for one cut at most
TOLERANCE = 0.2  # of ``want``: a cut within it of its target rank is taken


class Probe(Protocol):
    """What the plan asks Milvus (:class:`KeyProbe`; a test can answer from a sorted array)."""

    def count(self, rng: PkRange) -> int: ...

    def smallest(self, rng: PkRange, limit: int) -> list: ...


class KeyProbe:
    """``count(*)`` and the smallest keys of a range through a :class:`Querier` (which counts its calls)."""

    def __init__(self, q: Any, pk: str, is_string: bool) -> None:
        self.q, self.pk, self.is_string = q, pk, is_string

    def count(self, rng: PkRange) -> int:
        return self.q.count(rng.expr(self.pk, self.is_string), rng.partition_names)

    def smallest(self, rng: PkRange, limit: int) -> list:
        return self.q.smallest_keys(rng.expr(self.pk, self.is_string), self.pk, rng.partition_names, limit)


# -- keys as numbers ----------------------------------------------------------------------------------
class _Ints:
    top = INT64_MAX

    @staticmethod
    def value(key: Any) -> int:
        return int(key)

    @staticmethod
    def key(v: int) -> int:
        return min(max(int(v), INT64_MIN), INT64_MAX)


class _Strings:
    """Strings as numbers of ``places`` digits in base len(alphabet) + 1: 0 = the string ended, i + 1 =
    ``alphabet[i]`` (a character not in it counts as the seen one below it); monotone in Milvus's order
    (code points, as UTF-8 bytes compare), one-to-one on strings of the alphabet."""

    def __init__(self, alphabet: list[str], places: int) -> None:
        self.alphabet, self.places = alphabet, places
        self.base = len(alphabet) + 1
        self.top = self.base ** places - 1

    def value(self, s: str) -> int:
        v = 0
        for i in range(self.places):
            d = 0
            if i < len(s):
                j = bisect_left(self.alphabet, s[i])
                d = j + 1 if j < len(self.alphabet) and self.alphabet[j] == s[i] else j
            v = v * self.base + d
        return v

    def key(self, v: int) -> str:
        v = min(max(int(v), 0), self.top)
        digits = []
        for _ in range(self.places):
            v, d = divmod(v, self.base)
            digits.append(d)
        out = []
        for d in reversed(digits):
            if d == 0:
                break
            out.append(self.alphabet[d - 1])
        return "".join(out)


# -- the search ----------------------------------------------------------------------------------------
class Cuts:
    """Known points of one range and the search for its cuts, in increasing rank order."""

    def __init__(self, probe: Probe, whole: PkRange, rows: int, is_string: bool) -> None:
        self.probe, self.whole, self.rows, self.is_string = probe, whole, rows, is_string
        self.keys: list = []
        self.ranks: list[int] = []
        self.chars: set[str] = set()
        self.longest = 0
        self.jumped: set = set()  # keys a ``limit`` query started from
        self.exhausted = False  # a ``limit`` query came back short: every key above its start is known
        if whole.lo is not None:
            self._add(whole.lo, 0)
        if whole.hi is not None:
            self._add(whole.hi, rows)
        if whole.lo is None or whole.hi is None:
            self._jump(None, 0)

    def _add(self, key: Any, rank: int, real: bool = True) -> None:
        """A point; ``real``: a key Milvus answered (or a bound), whose characters the numbers learn."""
        i = bisect_left(self.keys, key)
        if i < len(self.keys) and self.keys[i] == key:
            self.ranks[i] = rank  # counted again: the newer count
        else:
            self.keys.insert(i, key)
            self.ranks.insert(i, rank)
        if self.is_string and real:
            self.chars.update(key)
            self.longest = max(self.longest, len(key))

    def _jump(self, start: Any, rank: int) -> None:
        """The smallest keys from ``start`` (None: the range's own lower end), ranked from ``rank``."""
        self.jumped.add(start)
        rng = self.whole if start is None else replace(self.whole, lo=start, after=False)
        keys = self.probe.smallest(rng, K)
        for i, k in enumerate(keys):
            self._add(k, rank + i)
        self.exhausted = self.exhausted or len(keys) < K

    def _numbers(self):
        return _Strings(sorted(self.chars), self.longest + 2) if self.is_string else _Ints

    def _inside(self, key: Any) -> bool:
        w = self.whole
        return (w.lo is None or key > w.lo) and (w.hi is None or key < w.hi)

    def _nearest(self, target: float) -> int | None:
        best = None
        for i, (k, r) in enumerate(zip(self.keys, self.ranks)):
            if self._inside(k) and (best is None or abs(r - target) < abs(self.ranks[best] - target)):
                best = i
        return best

    def _bracket(self, target: float) -> tuple[int | None, int | None]:
        """The last point below ``target`` (key order) and the first point after it above ``target``."""
        below = None
        for i, r in enumerate(self.ranks):
            if r < target:
                below = i
        if below is None:
            return None, None
        above = next((j for j in range(below + 1, len(self.ranks)) if self.ranks[j] > target), None)
        return below, above

    def _slope(self, ia: int, nums: Any) -> tuple[int, int] | None:
        """Key units per row just below point ``ia`` as (units, rows), from the nearest point with fewer rows."""
        va, ra = nums.value(self.keys[ia]), self.ranks[ia]
        for j in range(ia - 1, -1, -1):
            if self.ranks[j] < ra and nums.value(self.keys[j]) < va:
                return va - nums.value(self.keys[j]), ra - self.ranks[j]
        return None

    def _extrapolate(self, ia: int, ib: int | None, target: float, reach: float) -> Any:
        """A key above point ``ia`` (below ``ib``) where the rows below it, at the density just below ``ia``
        times ``reach``, would reach ``target``; None when the numbers write none."""
        nums = self._numbers()
        va, ra = nums.value(self.keys[ia]), self.ranks[ia]
        slope = self._slope(ia, nums)
        units, rows = slope if slope else (max(1, va - nums.value(self.keys[0])), 1)
        todo = int((target - ra) * reach * 64)  # rows to go, in 64ths (integers: VarChar numbers exceed a float)
        vb = nums.value(self.keys[ib]) if ib is not None else nums.top + 1
        return self._checked(ia, ib, nums.key(min(va + max(1, units * todo // (rows * 64)), vb - 1)))

    def _interpolate(self, ia: int, ib: int, target: float) -> Any:
        nums = self._numbers()
        va, vb, ra = nums.value(self.keys[ia]), nums.value(self.keys[ib]), self.ranks[ia]
        x = self._checked(ia, ib, nums.key(va + (vb - va) * int((target - ra) * 64) // ((self.ranks[ib] - ra) * 64)))
        return x if x is not None else midpoint(PkRange(self.keys[ia], self.keys[ib]), self.is_string)

    def _checked(self, ia: int, ib: int | None, x: Any) -> Any:
        """``x`` if it lies strictly between points ``ia`` and ``ib`` and inside the range, else None."""
        above = x > self.keys[ia] and (ib is None or x < self.keys[ib])
        return x if above and self._inside(x) else None

    def _next(self, ia: int, ib: int | None, target: float, sides: list[str], reach: float) -> Any:
        """The next key to count (None: jump from point ``ia`` instead)."""
        if ib is None:
            return self._extrapolate(ia, None, target, reach)
        stalled = len(sides) >= 2 and sides[-1] == sides[-2]
        if stalled and "jump" not in sides:
            return None  # the rows of the bracket lie close to one end: the keys just above its lower end
        if stalled:
            return midpoint(PkRange(self.keys[ia], self.keys[ib]), self.is_string)
        if sides and sides[-1] == "jump":
            return self._extrapolate(ia, ib, target, 1.0)  # at the density of the keys just found
        return self._interpolate(ia, ib, target)

    def cut(self, target: float, tol: float) -> tuple[Any, int] | None:
        """A cut (key, rank) with its rank within ``tol`` of ``target``, else the nearest found; None when
        no key lies inside the range."""
        sides: list[str] = []  # where each call landed: "below" or "above" the target, or "jump"
        reach = 1.0  # of the density seen, above every known point; x2 after each shortfall
        for _ in range(MAX_STEPS):
            near = self._nearest(target)
            if near is not None and abs(self.ranks[near] - target) <= tol:
                break
            ia, ib = self._bracket(target)
            if ia is None or (ib is None and self.exhausted):
                break
            x = self._next(ia, ib, target, sides, reach)
            if x is None:
                if self.keys[ia] in self.jumped:
                    break
                self._jump(self.keys[ia], self.ranks[ia])
                sides.append("jump")
                continue
            r = self.probe.count(replace(self.whole, hi=x))
            self._add(x, r, real=False)
            sides.append("below" if r < target else "above")
            if ib is None and r < target:
                reach *= 2
                if r <= self.ranks[ia] and x not in self.jumped:
                    self._jump(x, r)  # nothing between: land on the next keys (none: the range ends below x)
                    sides.append("jump")
        near = self._nearest(target)
        return (self.keys[near], self.ranks[near]) if near is not None else None

    def forget_below(self, key: Any) -> None:
        """Drop points below the one before ``key`` (later cuts are above it; the one before keeps the slope)."""
        i = max(0, bisect_left(self.keys, key) - 1)
        del self.keys[:i], self.ranks[:i]


def pieces(probe: Probe, whole: PkRange, want: int, is_string: bool, rows: int = -1,
           tolerance: float = TOLERANCE) -> Iterator[PkRange]:
    """``whole`` cut into pieces of about ``want`` rows, in key order, yielded as each cut is found; together
    they cover ``whole`` exactly. ``rows``: its count when known (-1: counted here)."""
    n = rows if rows >= 0 else probe.count(whole)
    k = max(1, round(n / max(1, want)))
    if k == 1:
        yield replace(whole, rows=n)
        return
    cuts = Cuts(probe, whole, n, is_string)
    lo, lo_rank, after = whole.lo, 0, whole.after
    for i in range(1, k):
        got = cuts.cut(n * i / k, tolerance * want)
        if got is None:
            break
        key, rank = got
        if lo is not None and key <= lo:
            continue
        yield replace(whole, lo=lo, hi=key, after=after, rows=max(0, rank - lo_rank))
        lo, lo_rank, after = key, rank, False
        cuts.forget_below(key)
    yield replace(whole, lo=lo, after=after, rows=max(0, n - lo_rank))
