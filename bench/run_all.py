"""``make bench``: run every benchmark script, write bench/results/*.json and the PNG charts.

Each script exposes ``run(**sizes) -> dict`` and prints its own table with ratios against a
baseline measured in the same run; this runner passes the sizes, collects the figures into
bench/results/<script>.json and all.json, and draws bench/results/ratios.png and scaling.png.

    python -m bench.run_all [script ...]        BENCH_SIZE=quick for a short run (a few minutes)
    make bench BENCH_SCRIPTS="bench_mirror_scale bench_mirror_driver"   some scripts, merged into all.json
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
import traceback
from pathlib import Path

SCRIPTS = [
    "bench.bench_codec",
    "bench.bench_decode26",
    "bench.bench_local",
    "bench.bench_kafka",
    "bench.bench_pulsar",
    "bench.profile_read",
    "bench.bench_spark_read",
    "bench.bench_spark_write",
    "bench.bench_scaling",
    "bench.bench_read_shape",
    "bench.bench_mirror",
    "bench.bench_lance",
    "bench.bench_storage_snapshot",
    "bench.bench_snapshot",
    "bench.bench_mirror_scale",
    "bench.bench_mirror_driver",
    "bench.bench_freshness",
    "bench.bench_keyindex",
    "bench.bench_store",
    "bench.bench_iceberg_catalog",
    "bench.bench_mirror_upkeep",
    "bench.bench_mirror_many",
]

# Sizes per script: "full" is what the README's figures come from (about 70-80 minutes on 2 cores, of them
# ~15 for bench_mirror (its S3 part ~8), ~20-25 for bench_mirror_scale (local and S3: ~12 of them for the S3
# server's 1M- and 8M-row tables, Delta and Iceberg), ~12-15 for bench_freshness (its S3 part ~5), ~5 for
# bench_mirror_driver and ~6 each for bench_snapshot and bench_storage_snapshot; the S3 parts start moto's
# server themselves: bench/_s3.py).
SIZES = {
    "full": {"bench.bench_spark_read": {"rows": 300_000, "mem_rows": 0, "kafka": True},
             "bench.bench_spark_write": {"rows": 50_000},
             "bench.profile_read": {"rows": 200_000, "kafka": True},
             "bench.bench_scaling": {"sizes": [1_000_000, 10_000_000]},
             "bench.bench_decode26": {"messages": 10_000},
             "bench.bench_read_shape": {"plan_rows": [100_000, 1_000_000, 10_000_000], "rows": 1_000_000,
                                        "split_rows": 2_000_000, "dim": 64},
             "bench.bench_mirror": {"rows": 1_000_000, "snapshot_rows": 200_000, "reps": 2},
             "bench.bench_lance": {"rows": 1_000_000, "reps": 2},  # #46: the Lance mirror vs the Delta mirror
             "bench.bench_storage_snapshot": {"sizes": (200_000, 2_000_000)},
             "bench.bench_snapshot": {"rows128": 200_000, "rows768": 20_000},
             # #27's and #37's sizes: a 10k-change batch into 1M vs 8M rows x 64-d, a local path and the S3 server
             "bench.bench_mirror_scale": {"small": 1_000_000},
             "bench.bench_mirror_driver": {"rows": 1_000_000, "dim": 768},
             "bench.bench_freshness": {"small": 1_000, "large": 4_000_000, "samples": 15},
             "bench.bench_keyindex": {"sizes": (100_000, 1_000_000)},
             "bench.bench_store": {"mib": 64, "small": 300},
             "bench.bench_iceberg_catalog": {"small": 10, "rows": 1000},
             "bench.bench_mirror_upkeep": {"batches": 500},
             # #44: 20 collections x 50k rows (64-d) + 10k changes in one database job vs 20 one-collection jobs
             # vs one job over one 1M-row collection; the freshness of 20 tables in one job
             "bench.bench_mirror_many": {"collections": 20, "rows": 50_000, "changes": 10_000, "samples": 10,
                                         "formats": ("delta", "iceberg")}},
    "quick": {"bench.bench_spark_read": {"rows": 200_000, "mem_rows": 0, "kafka": True},
              "bench.bench_spark_write": {"rows": 20_000, "reps": 2},
              "bench.profile_read": {"rows": 50_000, "kafka": True},
              "bench.bench_scaling": {"sizes": [100_000, 1_000_000], "channel_counts": [1, 4, 16]},
              "bench.bench_decode26": {"messages": 5_000},
              "bench.bench_read_shape": {"plan_rows": [100_000, 1_000_000], "rows": 200_000, "split_rows": 400_000,
                                         "reps": 3},
              "bench.bench_mirror": {"rows": 100_000, "snapshot_rows": 50_000, "reps": 1},
              "bench.bench_lance": {"rows": 100_000, "reps": 1},
              "bench.bench_storage_snapshot": {"sizes": (20_000, 200_000)},
              "bench.bench_snapshot": {"rows128": 50_000, "rows768": 5_000, "reps": 2},
              "bench.bench_mirror_scale": {"small": 50_000, "updates_table": 50_000, "update_batches": 20},
              "bench.bench_mirror_driver": {"rows": 100_000, "dim": 768},
              "bench.bench_freshness": {"small": 1_000, "large": 400_000, "samples": 8},
              "bench.bench_keyindex": {"sizes": (100_000, 1_000_000), "reps": 3},
              "bench.bench_store": {"mib": 16, "small": 100},
              "bench.bench_iceberg_catalog": {"small": 5, "rows": 200, "reps": 3},
              "bench.bench_mirror_upkeep": {"batches": 120},
              "bench.bench_mirror_many": {"collections": 20, "rows": 5_000, "changes": 2_000, "samples": 5,
                                          "separate_run": 4, "formats": ("delta", "iceberg")}},
}


def _module(name: str) -> str:
    """``bench_kafka``, ``bench.bench_kafka`` or ``bench/bench_kafka.py`` -> ``bench.bench_kafka``; an unknown
    name is an error naming the scripts there are (before anything runs)."""
    short = name.removesuffix(".py").replace("/", ".").removeprefix("bench.")
    if not (Path(__file__).parent / f"{short}.py").is_file():
        known = ", ".join(s.removeprefix("bench.") for s in SCRIPTS)
        raise SystemExit(f"bench.run_all: no benchmark script {name!r} in bench/ (make bench's scripts: {known})")
    return f"bench.{short}"


def main(argv: list[str] | None = None) -> int:
    """Runs the scripts named in ``argv`` (default: the command line; none: every script of SCRIPTS). A run
    of some scripts replaces their entries in bench/results/all.json and keeps the others' (the charts are
    redrawn from the merged file); a run of all of them starts all.json afresh."""
    args = argv if argv is not None else sys.argv[1:]
    wanted = [_module(a) for a in args] or SCRIPTS
    size = os.environ.get("BENCH_SIZE", "full")
    if size not in SIZES:
        raise SystemExit(f"bench.run_all: BENCH_SIZE={size!r} is not one of {sorted(SIZES)}")
    sizes = SIZES[size]
    out = Path("bench/results")
    out.mkdir(parents=True, exist_ok=True)
    all_path = out / "all.json"
    results: dict[str, object] = json.loads(all_path.read_text()) if all_path.exists() and args else {}
    failed = 0
    t_all = time.monotonic()
    for name in wanted:
        print(f"\n=== {name} ({size}) ===", flush=True)
        t0 = time.monotonic()
        try:
            mod = importlib.import_module(name)
            results[name] = mod.run(**sizes.get(name, {}))
        except Exception as exc:  # noqa: BLE001 - report and go on with the others
            failed += 1
            traceback.print_exc()
            results[name] = {"error": f"{type(exc).__name__}: {exc}"}
        took = time.monotonic() - t0
        if isinstance(results[name], dict):
            results[name]["bench_seconds"] = round(took, 1)  # type: ignore[index]
        (out / f"{name.split('.')[-1]}.json").write_text(json.dumps(results[name], indent=2, default=str))
        print(f"({name}: {took:.1f}s)", flush=True)
    all_path.write_text(json.dumps(results, indent=2, default=str))
    print(f"\nwrote {all_path} ({time.monotonic() - t_all:.0f}s in all)\n")
    from bench.charts import main as charts

    charts([str(all_path)])
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
