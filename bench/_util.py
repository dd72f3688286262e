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


# Payload sizes the broker benchmarks move: small messages (per-message overhead dominates) and
# Milvus-sized ones (an insert of 1000 rows x 128-d float vectors is ~0.5 MB; 64 KiB is a small one).
BROKER_CASES = [(1024, 20_000), (64 * 1024, 5_000)]


def median(xs: list[float]) -> float:
    s = sorted(xs)
    n = len(s)
    return s[n // 2] if n % 2 else (s[n // 2 - 1] + s[n // 2]) / 2


def broker_comparison(label: str, bare: Callable[[list[bytes]], tuple[float, ...]],
                      ours: Callable[[list[bytes]], tuple[float, ...]], reps: int = 5,
                      cases: list[tuple[int, int]] | None = None) -> dict:
    """Produce/consume seconds of a bare client loop and of the backend, interleaved A/B ``reps``
    times per payload size; ratios are of the medians. ``ours`` may return a third figure: the
    bulk read (``receive_raw``) next to ``receive_batch``. Prints a table per size."""
    res: dict = {}
    for size, count in cases or BROKER_CASES:
        blocks = [bytes([j]) * size for j in range(251)]  # shared payload objects: bounded memory
        payloads = [blocks[i % 251] for i in range(count)]
        runs_b, runs_o = [], []
        for _ in range(reps):
            runs_b.append(bare(payloads))
            runs_o.append(ours(payloads))
        bp, bc = median([r[0] for r in runs_b]), median([r[1] for r in runs_b])
        op, oc = median([r[0] for r in runs_o]), median([r[1] for r in runs_o])
        n = count
        r = {"messages": n, "payload_bytes": size, "reps": reps, "bare_produce_msgs_s": n / bp,
             "produce_msgs_s": n / op, "bare_consume_msgs_s": n / bc, "consume_msgs_s": n / oc,
             "produce_ratio": bp / op, "consume_ratio": bc / oc}
        rows = [(f"bare {label} produce", n / bp, None), ("backend send_batch", n / op, bp / op),
                (f"bare {label} consume", n / bc, None), ("backend receive_batch", n / oc, bc / oc)]
        if all(len(x) > 2 for x in runs_o):
            orw = median([x[2] for x in runs_o])
            r.update(consume_raw_msgs_s=n / orw, consume_raw_ratio=bc / orw)
            rows.append(("backend receive_raw (bulk path)", n / orw, bc / orw))
        res[f"{size}B"] = r
        print(f"-- {size:,}-byte payloads, {count:,} messages, median of {reps} interleaved runs")
        print(table(rows, unit="msgs/s"))
        extra = f", bulk consume {r['consume_raw_ratio']:.2f}x" if "consume_raw_ratio" in r else ""
        print(f"produce {bp / op:.2f}x, consume {bc / oc:.2f}x{extra} of bare (goal >= 0.9)", flush=True)
    return res


def load_average() -> float:
    """The machine's 1-minute load average (printed beside each figure: the machine is shared)."""
    import os

    return round(os.getloadavg()[0], 2)


def figure(base: list[float], ours: list[float], goal: float | None = None) -> dict:
    """A ratio of two interleaved series of seconds (``base[i]`` and ``ours[i]`` ran side by side): the
    ratio of the medians (baseline time / our time: higher is better), its spread (the lowest and highest
    ratio of a pair) and, against ``goal``, a verdict: ``met`` or ``missed`` only when every pair lies on
    the same side of the goal; ``within noise`` when the spread is larger than the gap (the goal lies
    inside it); one pair: ``one run``."""
    if not base or len(base) != len(ours):
        raise ValueError(f"figure needs two series of the same length, got {len(base)} and {len(ours)}")
    pairs = [b / o for b, o in zip(base, ours)]
    ratio = median(base) / median(ours)
    out: dict = {"ratio": round(ratio, 3), "spread": [round(min(pairs), 3), round(max(pairs), 3)],
                 "pairs": [round(p, 3) for p in pairs], "runs": len(pairs),
                 "base_s": [round(x, 4) for x in base], "ours_s": [round(x, 4) for x in ours],
                 "load": load_average()}
    if goal is not None:
        out["goal"] = goal
        if len(pairs) == 1:
            out["verdict"] = "one run"
        elif min(pairs) >= goal:
            out["verdict"] = "met"
        elif max(pairs) < goal:
            out["verdict"] = "missed"
        else:
            out["verdict"] = "within noise"
    return out


def describe(fig: dict) -> str:
    """``0.76 (0.70-0.81 over 5 runs, load 3.1): met`` - how the scripts print a figure."""
    lo, hi = fig["spread"]
    text = f"{fig['ratio']:.2f} ({lo:.2f}-{hi:.2f} over {fig['runs']} runs, load {fig['load']})"
    if "goal" in fig:
        text += f" goal >= {fig['goal']}: {fig['verdict']}"
    return text
