"""Hybrid timestamps (Milvus TSO): ``physical_ms << 18 | logical`` (wire doc §9)."""

from __future__ import annotations

import re
import time
from datetime import datetime, timezone

LOGICAL_BITS = 18
LOGICAL_MASK = (1 << LOGICAL_BITS) - 1
MAX_TIMESTAMP = (1 << 64) - 1


def compose(physical_ms: int, logical: int = 0) -> int:
    """Hybrid ts from Unix epoch milliseconds and a logical counter (< 2**18)."""
    if not 0 <= logical <= LOGICAL_MASK:
        raise ValueError(f"logical part must be in [0, {LOGICAL_MASK}], got {logical}")
    return (int(physical_ms) << LOGICAL_BITS) | int(logical)


def physical_ms(ts: int) -> int:
    return int(ts) >> LOGICAL_BITS


def logical(ts: int) -> int:
    return int(ts) & LOGICAL_MASK


def to_datetime(ts: int) -> datetime:
    """UTC datetime of the physical part."""
    return datetime.fromtimestamp(physical_ms(ts) / 1000.0, tz=timezone.utc)


def from_datetime(dt: datetime, logical: int = 0) -> int:
    """Hybrid ts of ``dt`` (naive datetimes are taken as UTC)."""
    if dt.tzinfo is None:
        dt = dt.replace(tzinfo=timezone.utc)
    return compose(round(dt.timestamp() * 1000), logical)


def now(logical: int = 0) -> int:
    return compose(int(time.time() * 1000), logical)


_DIGITS = re.compile(r"^\d+$")


def parse_timestamp(value: int | str | datetime) -> int:
    """A hybrid ts from an int, a digit string (hybrid ts) or ISO-8601 text (naive = UTC)."""
    if isinstance(value, bool):
        raise ValueError(f"not a timestamp: {value!r}")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"timestamp must be >= 0, got {value}")
        return value
    if isinstance(value, datetime):
        return from_datetime(value)
    text = str(value).strip()
    if _DIGITS.match(text):
        return int(text)
    try:
        dt = datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise ValueError(
            f"not a timestamp: {value!r}; expected a hybrid timestamp (integer) or ISO-8601 text "
            "such as 2025-01-01T00:00:00Z"
        ) from None
    return from_datetime(dt)
