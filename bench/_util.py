"""Timing helpers shared by the benchmark scripts: best-of-N wall time, ratios, a table."""

from __future__ import annotations

import time
from collections.abc import Callable


def best_of(fn: Callable[[], object], repeat: int = 5) -> float:
    """The fastest of ``repeat`` runs, in seconds (the least disturbed by a noisy machine)."""
    best = float("inf")
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def table(rows: list[tuple[str, float, float | None]], unit: str = "rows/s") -> str:
    """name, rate, ratio-to-baseline lines."""
    out = [f"{'measure':<46} {unit:>14} {'vs baseline':>12}"]
    for name, rate, ratio in rows:
        r = f"{ratio:>11.2f}x" if ratio is not None else f"{'(baseline)':>12}"
        out.append(f"{name:<46} {rate:>14,.0f} {r}")
    return "\n".join(out)
