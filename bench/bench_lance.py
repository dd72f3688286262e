"""The Lance mirror next to the Delta mirror on the same events (#46 part 4: goal >= 0.8).

``python -m bench.bench_lance [--rows N] [--reps K]``: a synthetic collection (pk, category, score, 8-d vec) of
``rows`` inserts and 10% deletes on the embedded log (2 channels, published once); ``msgstream mirror run
--snapshot never`` into a Delta table and into a Lance table in a local directory, ``reps`` pairs in one Spark
session, the order alternating (Delta then Lance, Lance then Delta); events/s of each, ratio = Lance / Delta of
the medians. Each table is then checked to hold the same rows (pk, category, score), and the Lance table's
vectors to be fixed-size lists (a vector index can be built on it).

Where the time goes in the Lance mirror: its tasks stage Parquet as for Delta and turn each file into a Lance
fragment (reading it back once) beside its key file; the driver's commit reads none of the batch's rows
(docs/mirror.md, "Lance").
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import tempfile
from pathlib import Path

from bench._util import median
from bench.bench_mirror import _mirror, _publish_log


def _rows_of(fmt: str, table: Path) -> list[tuple]:
    from msgstream_spark.mirror.table import open_existing

    t = open_existing(fmt, str(table))
    got = t.to_arrow().select(["pk", "category", "score"])
    return sorted(tuple(r.values()) for r in got.to_pylist())


def run(rows: int = 1_000_000, reps: int = 2) -> dict:
    from msgstream_spark.jobs._common import spark_session

    work = Path(tempfile.mkdtemp(prefix="bench-lance-"))
    os.environ["MSGSTREAM_KEY_CACHE_DIR"] = str(work / "key-cache")  # before Spark starts its Python workers
    spark = spark_session("bench-lance", "local[2]")
    events = rows + rows // 10
    secs: dict[str, list[float]] = {"delta": [], "lance": []}
    try:
        cfg, channels = _publish_log(spark, work, rows)
        for i in range(reps):
            for fmt in (("delta", "lance") if i % 2 == 0 else ("lance", "delta")):
                took, _ = _mirror(spark, cfg, channels, work / f"{fmt}-{i}", fmt, "bench", "--snapshot", "never",
                                  "--checkpoint", str(work / f"chk-{fmt}-{i}"))
                secs[fmt].append(took)
                print(f"  {fmt:6} run {i}: {took:.1f} s ({events / took:,.0f} events/s)", flush=True)
        same = _rows_of("delta", work / "delta-0") == _rows_of("lance", work / "lance-0")
        import lance
        import pyarrow as pa

        fixed = pa.types.is_fixed_size_list(lance.dataset(str(work / "lance-0")).schema.field("vec").type)
    finally:
        with contextlib.suppress(OSError):
            shutil.rmtree(work)
    d, la = median(secs["delta"]), median(secs["lance"])
    out = {"rows": rows, "events": events, "reps": reps,
           "delta_events_per_s": round(events / d, 1), "lance_events_per_s": round(events / la, 1),
           "lance_vs_delta": round(d / la, 3), "same_rows": same, "lance_vectors_fixed_size": fixed,
           "seconds": {k: [round(s, 2) for s in v] for k, v in secs.items()}}
    print(f"mirror of {rows} rows + 10% deletes ({events} events), events/s, median of {reps}: "
          f"Delta {out['delta_events_per_s']:,.0f}, Lance {out['lance_events_per_s']:,.0f}, "
          f"Lance/Delta {out['lance_vs_delta']:.2f} (goal >= 0.8); same rows: {same}; fixed-size vectors: {fixed}")
    return out


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=1_000_000, help="inserts in the mirrored log (10%% deletes follow)")
    ap.add_argument("--reps", type=int, default=2, help="Delta/Lance pairs")
    a = ap.parse_args(argv)
    run(rows=a.rows, reps=a.reps)


if __name__ == "__main__":
    main()
