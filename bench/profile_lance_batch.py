"""Where a warm Lance batch's time goes at two table sizes (issue #46: a 10k-change batch at 8x the rows must cost
about the same), and what it writes of Lance's own files.

    python -m bench.profile_lance_batch [--small 125000] [--dim 64] [--batch 10000] [--reps 3] [--top 25]
        [--file-rows N] [--after-cold]

Two Lance tables on a local path, ``small`` and 8 x ``small`` rows, built as bench_mirror_scale builds them (a
snapshot's Parquet files of ``small // 4`` rows, at most 250k, registered with ``add_files``: 4 and 32 fragments
at the bench's sizes); the first batch into each, then ``reps`` rounds of a warm mixed batch (half new keys, 40%
updates, 10% deletes of random existing keys) under cProfile (``--after-cold``: each one after a batch of a new
executor, as bench_mirror_scale's warm batch), the tables taking turns. Prints per size: the CPU
of the batches, the functions with the most cumulative time, and per batch what Lance wrote under the table
(manifests, transaction files, deletion files: files and bytes) and how many fragments the table has.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import io
import pstats
import shutil
import tempfile
import time
from pathlib import Path

from bench._util import load_average
from bench.bench_mirror_scale import Sized, Where, _snapshot_table, new_executor
from msgstream_spark.mirror.store.writer import writer_lock


def _files(root: Path) -> dict[str, int]:
    return {str(p.relative_to(root)): p.stat().st_size for p in root.rglob("*") if p.is_file()}


def _written(before: dict[str, int], after: dict[str, int]) -> dict[str, tuple[int, int]]:
    """New files by kind (their top directory, or their suffix under data/): (count, bytes)."""
    out: dict[str, list[int]] = {}
    for k, size in after.items():
        if k in before:
            continue
        kind = k.split("/", 1)[0] if not k.startswith("data/") else "data/" + (
            "_keys_of" if "/_keys_of/" in k else k.rsplit(".", 1)[-1])
        got = out.setdefault(kind, [0, 0])
        got[0] += 1
        got[1] += size
    return {k: (v[0], v[1]) for k, v in sorted(out.items())}


def _difference(a: cProfile.Profile, b: cProfile.Profile, reps: int, top: int) -> None:
    """The functions whose CPU (cumulative, per batch) grew most from the small table to the large one."""
    sa, sb = pstats.Stats(a).stats, pstats.Stats(b).stats  # type: ignore[attr-defined]
    rows = []
    for fn, (_, nb, _, cb, _) in sb.items():
        na, ca = (sa[fn][1], sa[fn][3]) if fn in sa else (0, 0.0)
        rows.append((cb - ca, fn, na, nb, ca, cb))
    rows.sort(reverse=True)
    print("\n=== CPU growth per batch (ms), small -> large (calls per batch)")
    for d, fn, na, nb, ca, cb in rows[:top]:
        name = f"{fn[0].rsplit('/', 2)[-1]}:{fn[1]}({fn[2]})"
        print(f"  {d / reps * 1e3:+8.2f}  {ca / reps * 1e3:8.2f} -> {cb / reps * 1e3:8.2f}  "
              f"calls {na / reps:6.1f} -> {nb / reps:6.1f}  {name}")


def run(small: int, dim: int, batch: int, reps: int, top: int, file_rows: int | None = None,
        after_cold: bool = False) -> None:
    work = Path(tempfile.mkdtemp(prefix="profile-lance-batch-"))
    print(f"load average {load_average()}", flush=True)
    try:
        where = Where(work)
        sizes = {"small": small, "large": 8 * small}
        tables = {}
        for k, rows in sizes.items():
            t0 = time.perf_counter()
            per_file = file_rows or max(1, min(rows // 4, 250_000))
            tables[k] = Sized(_snapshot_table(where, "lance", k, rows, dim, per_file), rows, batch, dim)
            print(f"{k}: {rows:,} rows written in {time.perf_counter() - t0:.1f} s", flush=True)
        for k in sizes:
            new_executor(work / "key-cache")
            first = tables[k].run(where, True)
            print(f"{k}: the first batch (it builds the key indexes) {first['s']:.3f} s, CPU {first['cpu_s']:.3f} s; "
                  f"load {load_average()}", flush=True)
        profs = {k: cProfile.Profile(time.process_time) for k in sizes}
        held = contextlib.ExitStack()
        for k in sizes:  # each table's writer lease held throughout, as the job (and bench_mirror_scale) holds it
            held.enter_context(writer_lock(tables[k].table.store, tables[k].table.location, "profile_lance_batch"))
        cpu = {k: [] for k in sizes}
        wrote = {k: [] for k in sizes}
        for _ in range(reps):
            for k in sizes:
                if after_cold:  # as bench_mirror_scale's warm batch: the one after a new executor's first
                    new_executor(work / "key-cache")
                    tables[k].run(where, True)
                before = _files(work / k)
                p0 = time.process_time()
                profs[k].enable()
                tables[k].run(where, True)
                profs[k].disable()
                cpu[k].append(time.process_time() - p0)
                wrote[k].append(_written(before, _files(work / k)))
        held.close()
        for k in sizes:
            frags = len(tables[k].table._table().get_fragments())
            print(f"\n=== {k}: {sizes[k]:,} rows, {frags} fragments; warm batch CPU "
                  f"{', '.join(f'{c:.3f}' for c in cpu[k])} s; load {load_average()}")
            for w in wrote[k]:
                print("  wrote", w)
            s = io.StringIO()
            pstats.Stats(profs[k], stream=s).sort_stats("cumulative").print_stats(top)
            print(s.getvalue())
        _difference(profs["small"], profs["large"], reps, top)
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--small", type=int, default=125_000)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--batch", type=int, default=10_000)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--top", type=int, default=25)
    p.add_argument("--file-rows", type=int, help="rows per snapshot file at both sizes (default: the bench's rule)")
    p.add_argument("--after-cold", action="store_true",
                   help="each profiled batch follows a new executor's first (bench_mirror_scale's warm batch)")
    a = p.parse_args()
    run(a.small, a.dim, a.batch, a.reps, a.top, a.file_rows, a.after_cold)


if __name__ == "__main__":
    main()
