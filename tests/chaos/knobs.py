"""The suite's single size knob, its seed and where figures go."""

from __future__ import annotations

import json
import os
import random
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

SIZES = {
    # kills: driver SIGKILLs per fault; backends: where fault 1 runs; soak_s: fault 6; bad: fault 5 payloads;
    # worker_kills: fault 3; restarts: broker restarts (fault 4). ``small`` is what `make test` runs: on
    # the shared 2-core machine a Spark driver takes 1-2 minutes to start, so it is one kill per fault. Bad
    # payloads cycle through the six kinds (tests/chaos/badinput.py): 300 are 50 of each, each kind's random
    # variants (a branch taken half the time) all drawn; `make chaos` pushes 1,000.
    "small": dict(kills=1, backends=("local",), soak_s=60, bad=300, worker_kills=1, restarts=1),
    "medium": dict(kills=2, backends=("local", "kafka", "pulsar-lite"), soak_s=180, bad=1000, worker_kills=2,
                   restarts=2),
    "large": dict(kills=5, backends=("local", "kafka", "pulsar-lite"), soak_s=600, bad=1000, worker_kills=3,
                  restarts=3),
}


def size_name() -> str:
    name = os.environ.get("MSGSTREAM_CHAOS_SIZE", "small")
    if name not in SIZES:
        raise ValueError(f"MSGSTREAM_CHAOS_SIZE must be one of {', '.join(SIZES)}, got {name!r}")
    return name


def size() -> dict:
    return dict(SIZES[size_name()])


def seed() -> int:
    """The run's seed: MSGSTREAM_CHAOS_SEED, else drawn once per process (and printed)."""
    global _SEED
    if _SEED is None:
        env = os.environ.get("MSGSTREAM_CHAOS_SEED")
        _SEED = int(env) if env else random.SystemRandom().randrange(1, 1 << 31)
    return _SEED


_SEED: int | None = None


def rng(name: str) -> random.Random:
    """A random source of its own per fault, derived from the run's seed (printed for replays)."""
    s = seed()
    print(f"[chaos] {name}: seed={s} (replay with MSGSTREAM_CHAOS_SEED={s} MSGSTREAM_CHAOS_SIZE={size_name()})",
          flush=True)
    return random.Random(f"{s}:{name}")


def results_dir() -> Path:
    d = Path(os.environ.get("MSGSTREAM_CHAOS_RESULTS") or Path(tempfile.gettempdir()) / "msgstream-chaos")
    d.mkdir(parents=True, exist_ok=True)
    return d


@dataclass
class Figures:
    """What one fault run measured; printed and written as ``<results>/<fault>.json``."""

    fault: str
    backend: str
    injected: int = 0
    rows_expected: int = 0
    rows_lost: int = 0
    rows_duplicated: int = 0
    recovery_s: list[float] = field(default_factory=list)
    extra: dict = field(default_factory=dict)

    def count(self, expected: list, got: list) -> None:
        """Lost and duplicated rows of ``got`` against ``expected`` (each expected exactly once)."""
        from collections import Counter

        want, have = Counter(expected), Counter(got)
        self.rows_expected = len(expected)
        self.rows_lost = sum(max(0, n - have[k]) for k, n in want.items())
        self.rows_duplicated = sum(max(0, n - want[k]) for k, n in have.items() if k in want)
        self.extra["rows_unexpected"] = sum(n for k, n in have.items() if k not in want)

    def save(self) -> Path:
        data = asdict(self)
        data.update(size=size_name(), seed=seed(), at=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()))
        rec = self.recovery_s
        data["recovery_max_s"] = round(max(rec), 2) if rec else None
        data["recovery_mean_s"] = round(sum(rec) / len(rec), 2) if rec else None
        print(f"[chaos] figures {json.dumps(data, sort_keys=True)}", flush=True)
        path = results_dir() / f"{self.fault}-{self.backend}.json"
        path.write_text(json.dumps(data, indent=1, sort_keys=True))
        return path
