"""What a DropPartition / TruncateCollection costs the mirror's driver: reading the table's keys.

``spark.removals.partition_deletes`` / ``truncate_deletes`` read the table's key and ``_partition`` (or ``_ts``)
columns on the driver to find the rows the message removed. This builds a Delta table of N rows (a 128-d float
vector, a string; one batch deleting 1%: deletion vectors on, as the job's tables have them) at two sizes an
order of magnitude apart and reads it both ways: the whole table then ``select`` (before), and the two columns
only (``to_arrow(columns)``, now). Reported: seconds, the bytes the process read (``/proc/self/io`` ``rchar``:
read calls, page cache included) and the Arrow bytes the read materialized. No assertion: figures.

    .venv/bin/python -m bench.bench_removal_read [--rows 20000,200000] [--dim 128]
"""

from __future__ import annotations

import argparse
import json
import tempfile
import time

import numpy as np
import pyarrow as pa

from msgstream_spark.mirror import apply_batch, open_table
from msgstream_spark.mirror.order import seq_array


def _rchar() -> int:
    with open("/proc/self/io") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))


def _batch(pks: np.ndarray, ts: int, dim: int, op: str) -> pa.Table:
    n = len(pks)
    t = np.full(n, ts, dtype=np.uint64)
    ins = op == "insert"
    flat = pa.array(np.random.default_rng(ts).random(n * dim, dtype=np.float32)) if ins else None
    fv = pa.FixedSizeListArray.from_arrays(flat, dim) if ins else pa.nulls(n, pa.list_(pa.float32(), dim))
    return pa.table({"op": [op] * n, "pk": pa.array(pks), "s": pa.array([f"row-{p}" for p in pks] if ins else
                                                                         [None] * n, pa.string()),
                     "fv": fv, "_channel": ["ch0"] * n, "_ts": pa.array(t.astype(np.int64)),
                     "_seq": seq_array(t, op), "_partition": pa.array(np.where(pks % 10 == 0, 2, 1))})


def _read(table, columns: list[str] | None, keep: list[str]) -> dict:
    r0, t0 = _rchar(), time.perf_counter()
    got = table.to_arrow(columns) if columns else table.to_arrow().select(keep)
    secs = time.perf_counter() - t0
    return {"seconds": round(secs, 3), "rchar_bytes": _rchar() - r0, "rows": got.num_rows}


def one(rows: int, dim: int) -> dict:
    fields = pa.schema([pa.field("pk", pa.int64()), pa.field("s", pa.string()),
                        pa.field("fv", pa.list_(pa.float32(), dim))])
    with tempfile.TemporaryDirectory() as d:
        t = open_table("delta", f"{d}/t", collection="bench", pk="pk", arrow_schema=fields)
        pks = np.arange(rows, dtype=np.int64)
        apply_batch(t, _batch(pks, 1 << 30, dim, "insert"), "pk", "bench", 0)
        apply_batch(t, _batch(pks[::100], 2 << 30, dim, "delete"), "pk", "bench", 1)
        keep = ["pk", "_partition"]
        t.to_arrow(["pk"])  # the log read once before either is measured
        whole = _read(t, None, keep)
        projected = _read(t, keep, keep)
        return {"rows": rows, "dim": dim, "whole_then_select": whole, "projected": projected}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", default="20000,200000")
    p.add_argument("--dim", type=int, default=128)
    a = p.parse_args()
    for n in (int(x) for x in a.rows.split(",")):
        print(json.dumps(one(n, a.dim)), flush=True)


if __name__ == "__main__":
    main()
