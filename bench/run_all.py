"""Run every benchmark script under bench/ and write their figures to bench/results/all.json.

Each script exposes ``run() -> dict`` and prints its own table with ratios against a
baseline measured in the same run; this runner only collects them.
"""

from __future__ import annotations

import importlib
import json
import sys
import time
import traceback
from pathlib import Path

SCRIPTS = [
    "bench.bench_codec",
    "bench.bench_local",
    "bench.bench_kafka",
    "bench.bench_pulsar",
    "bench.bench_spark_read",
    "bench.bench_spark_write",
]


def main(argv: list[str] | None = None) -> int:
    wanted = (argv if argv is not None else sys.argv[1:]) or SCRIPTS
    results: dict[str, object] = {}
    failed = 0
    for name in wanted:
        name = name if name.startswith("bench.") else f"bench.{name}"
        print(f"\n=== {name} ===", flush=True)
        t0 = time.monotonic()
        try:
            mod = importlib.import_module(name)
            results[name] = mod.run()
        except Exception as exc:  # noqa: BLE001 - report and go on with the others
            failed += 1
            traceback.print_exc()
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
        print(f"({name}: {time.monotonic() - t0:.1f}s)", flush=True)
    out = Path("bench/results")
    out.mkdir(parents=True, exist_ok=True)
    (out / "all.json").write_text(json.dumps(results, indent=2, default=str))
    print(f"\nwrote {out / 'all.json'}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
