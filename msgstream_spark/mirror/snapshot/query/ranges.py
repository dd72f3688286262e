"""Primary-key ranges of a snapshot: their expressions and their midpoints.

Spark-free. A range is ``lo <= pk < hi`` (``pk > lo`` when ``after``), None open on that side. The
midpoint of two Int64 bounds is their integer mean, of two VarChar bounds the mean of the strings read as
numbers in base 0x10F801 (one digit per Unicode scalar value, 0 for "the string ended"), which keeps
Milvus's order (UTF-8 bytes compare as code points): an answer refused as too large is read in halves, and
the plan (mirror/snapshot/query/plan.py) bisects where its guesses keep landing on one side.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
_SURROGATES = 0x800  # U+D800..U+DFFF are not scalar values (no UTF-8 form, Milvus rejects their escapes)
_BASE = 0x110000 - _SURROGATES + 1  # digits: 0 = end of string, 1.. = scalar values in order


def string_literal(s: str) -> str:
    """``s`` as a Milvus expression string literal: double quotes, ``\\`` and ``"`` escaped, control
    characters as ``\\u00XX``, every other character (non-BMP ones included) as itself. Milvus's parser
    unquotes with Go's ``strconv.Unquote``, which refuses surrogate escapes (what ``json.dumps`` writes
    for a non-BMP character)."""
    out = []
    for ch in s:
        if ch in ('"', "\\"):
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


@dataclass(frozen=True)
class PkRange:
    """``lo <= pk < hi`` (``lo < pk`` when ``after``); None is open on that side. ``partition``: the one
    partition it is read from (its rows get ``partition_id`` as ``_partition``); None: every partition
    (``_partition`` null). ``rows``: its ``count(*)`` when planned (-1: not counted)."""

    lo: Any = None
    hi: Any = None
    partition: str | None = None
    partition_id: int | None = None
    rows: int = -1
    after: bool = False

    @property
    def partition_names(self) -> list[str]:
        return [self.partition] if self.partition is not None else []

    def expr(self, pk: str, is_string: bool) -> str:
        def lit(v: Any) -> str:
            return string_literal(v) if is_string else str(int(v))

        parts = []
        if self.lo is not None:
            parts.append(f"{pk} {'>' if self.after else '>='} {lit(self.lo)}")
        if self.hi is not None:
            parts.append(f"{pk} < {lit(self.hi)}")
        if not parts:  # every key (Milvus 2.3.5 cannot parse -9223372036854775808: no lower literal)
            return f'{pk} >= ""' if is_string else f"{pk} < 0 or {pk} >= 0"
        return " and ".join(parts)

    def __str__(self) -> str:
        where = f" of partition {self.partition!r}" if self.partition is not None else ""
        return f"[{self.lo!r}{' (exclusive)' if self.after else ''}, {self.hi!r}){where}"


# -- midpoints ------------------------------------------------------------------------------------
def _digit(ch: str) -> int:
    cp = ord(ch)
    return cp + 1 if cp < 0xD800 else cp + 1 - _SURROGATES


def _char(d: int) -> str:
    cp = d - 1
    return chr(cp if cp < 0xD800 else cp + _SURROGATES)


def _value(s: str, places: int) -> int:
    v = 0
    for i in range(places):
        v = v * _BASE + (_digit(s[i]) if i < len(s) else 0)
    return v


def _string_mid(lo: str | None, hi: str | None) -> str | None:
    a = lo or ""
    places = max(len(a), len(hi or "")) + 2
    top = _value(hi, places) if hi is not None else _BASE ** places
    m = (_value(a, places) + top) // 2
    digits = []
    for _ in range(places):
        m, d = divmod(m, _BASE)
        digits.append(d)
    digits.reverse()
    out = []
    for d in digits:  # the string ends at its first 0 digit (a value just below the mean)
        if d == 0:
            break
        out.append(_char(d))
    mid = "".join(out)
    if mid <= a:  # the mean lies between ``a`` and ``a`` + U+0000: the next string after ``a``
        mid = a + "\x00"
    return mid if mid > a and (hi is None or mid < hi) else None


def midpoint(rng: PkRange, is_string: bool) -> Any:
    """A key strictly inside ``rng`` near the middle of its values; None when there is none (a range
    that holds one key at most)."""
    if is_string:
        return _string_mid(rng.lo, rng.hi)
    lo = INT64_MIN if rng.lo is None else int(rng.lo) + (1 if rng.after else 0)
    hi = INT64_MAX + 1 if rng.hi is None else int(rng.hi)
    m = (lo + hi) // 2
    return m if lo < m < hi else None


def halves(rng: PkRange, is_string: bool) -> tuple[PkRange, PkRange] | None:
    """``rng`` cut at its midpoint (uncounted), or None."""
    m = midpoint(rng, is_string)
    if m is None:
        return None
    return replace(rng, hi=m, rows=-1), replace(rng, lo=m, after=False, rows=-1)
