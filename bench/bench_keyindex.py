"""What the key index's checksums cost: a side file written (CRC-32 per block, fsync, rename) and opened in a
new process (its header checked, every block's CRC-32 verified once) against reading the data file's key and
``_seq`` columns (what a lookup without the index pays, the baseline measured in the same run), at two sizes.

``python -m bench.bench_keyindex [--sizes 100000 1000000] [--reps 5]``: a Parquet data file of N random int64
keys and their ``_seq`` (zstd); per size, best of ``reps``:
- read columns: ``pq.read_table(path, columns=[pk, _seq])`` (the baseline);
- build + write: ``key_index`` with no side file (the columns read, sorted, the side file written and fsync'd);
- open, verify: ``key_index`` in a "new process" (its mapped and verified side files forgotten): its header
  checked (the blocks are checked as lookups read them, since the cold lookup below; before, every block's
  CRC-32 was computed here: the file read once);
- open, verified before: the same file opened again after its mapping was dropped (header only);
- 1,000 lookups' keys: ``find`` on the mapped index (every lookup after the first open);
- a cold lookup: open in a new process and ``find`` 1,000 random keys of the file, its CPU seconds (what a new
  executor's first batch pays per data file: the header checked, then only the blocks those keys touch
  verified, so it grows with the keys, not the file: compare ``--sizes 1000000 10000000``).
The cold lookup's growth = its CPU at the larger size / at the smaller one (before blocks were checked as read:
~8.7x for 10x rows, every block of the file checked on open; measured 2026-12-06: 1.5-1.7x).
"""

from __future__ import annotations

import argparse
import os
import shutil
import tempfile
import time
import zlib
from decimal import Decimal

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench._util import best_of, table
from msgstream_spark.mirror.order import SEQ, SEQ_TYPE
from msgstream_spark.mirror.store import open_store
from msgstream_spark.mirror.write import keyindex
from msgstream_spark.mirror.write.keyindex import key_index, side_path


def _data_file(path: str, rows: int) -> np.ndarray:
    rng = np.random.default_rng(rows)
    keys = rng.integers(-10**15, 10**15, rows)
    words = np.zeros((rows, 2), np.uint64)  # decimal128 little-endian: low word random, high word 0
    words[:, 0] = rng.integers(1, 2**62, rows).astype(np.uint64)
    seq = pa.Array.from_buffers(SEQ_TYPE, rows, [None, pa.py_buffer(words.tobytes())])
    assert seq[0].as_py() == Decimal(int(words[0, 0]))
    pq.write_table(pa.table({"pk": pa.array(keys, pa.int64()), SEQ: seq}), path, compression="zstd")
    return keys


def _forget(side: bool) -> None:
    keyindex._OPEN.clear()  # a new process: nothing mapped
    if side:
        keyindex._VERIFIED.clear()  # ... nor verified


def _one_size(d: str, rows: int, reps: int) -> dict:
    path = os.path.join(d, f"data-{rows}.parquet")
    keys = _data_file(path, rows)
    want = np.unique(np.random.default_rng(7).choice(keys, 1000))

    def build() -> None:
        _forget(True)
        if os.path.exists(side_path(path)):
            os.unlink(side_path(path))
        key_index(open_store(path), path, "pk", rows)

    def open_new() -> None:
        _forget(True)
        key_index(open_store(path), path, "pk", rows)

    def open_again() -> None:
        _forget(False)
        key_index(open_store(path), path, "pk", rows)

    base = best_of(lambda: pq.read_table(path, columns=["pk", SEQ]), reps)
    built = best_of(build, reps)
    verify = best_of(open_new, reps)
    again = best_of(open_again, reps)
    idx = key_index(open_store(path), path, "pk", rows)
    find = best_of(lambda: idx.find(want), reps)
    cold = _cold_cpu(path, rows, want, reps)
    raw = open(side_path(path), "rb").read()
    crc = best_of(lambda: zlib.crc32(raw), reps)
    print(f"-- {rows:,} rows: data file {os.path.getsize(path) / 1e6:.1f} MB, side file "
          f"{os.path.getsize(side_path(path)) / 1e6:.1f} MB, best of {reps}")
    print(table([("read key + _seq columns", base * 1e6, None), ("build + write side file", built * 1e6, built / base),
                 ("  of it: CRC-32 of the side file's bytes", crc * 1e6, crc / base),
                 ("open in a new process (verify)", verify * 1e6, verify / base),
                 ("open again (verified before)", again * 1e6, again / base),
                 ("find 1,000 keys", find * 1e6, find / base),
                 ("cold lookup of 1,000 keys (CPU)", cold * 1e6, cold / base)], unit="us"))
    return {"rows": rows, "read_columns_s": base, "build_write_s": built, "open_verify_s": verify,
            "open_verified_s": again, "find_1000_s": find, "cold_lookup_cpu_s": cold, "crc32_s": crc,
            "verify_s": verify - again,
            "verify_vs_read": (verify - again) / base}


def _cold_cpu(path: str, rows: int, want: np.ndarray, reps: int) -> float:
    """The least CPU seconds of ``reps`` cold lookups (a new process: nothing mapped nor verified) of ``want``."""
    best = float("inf")
    for _ in range(reps):
        _forget(True)
        t0 = time.process_time()
        got = key_index(open_store(path), path, "pk", rows).find(want)
        best = min(best, time.process_time() - t0)
        assert len(got[0]) >= len(want)
    return best


def run(sizes: tuple[int, ...] = (100_000, 1_000_000), reps: int = 5) -> dict:
    d = tempfile.mkdtemp(prefix="bench-keyindex-")
    try:
        res = {str(n): _one_size(d, n, reps) for n in sizes}
    finally:
        shutil.rmtree(d, ignore_errors=True)
    lo, hi = res[str(sizes[0])], res[str(sizes[-1])]
    res["rows_growth"] = sizes[-1] / sizes[0]
    res["cold_lookup_growth"] = hi["cold_lookup_cpu_s"] / lo["cold_lookup_cpu_s"]
    print(f"cold lookup of 1,000 keys (CPU) {lo['cold_lookup_cpu_s'] * 1e3:.1f} ms -> "
          f"{hi['cold_lookup_cpu_s'] * 1e3:.1f} ms ({res['cold_lookup_growth']:.2f}x for "
          f"{res['rows_growth']:.0f}x rows)")
    print(f"open in a new process (the header checked) {lo['open_verify_s'] * 1e3:.1f} ms -> "
          f"{hi['open_verify_s'] * 1e3:.1f} ms; the blocks are checked as lookups read them", flush=True)
    return res


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="bench_keyindex", description=__doc__.split("\n\n")[0])
    p.add_argument("--sizes", type=int, nargs="+", default=[100_000, 1_000_000])
    p.add_argument("--reps", type=int, default=5)
    a = p.parse_args(argv)
    run(tuple(a.sizes), a.reps)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
