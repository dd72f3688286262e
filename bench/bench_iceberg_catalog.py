"""One mirror batch on an Iceberg table as its history grows, on a local disk (the default SQLite catalog beside
the table) and on moto's S3 server through a SQL catalog on PostgreSQL (the tests' servers, on loopback; a SQLite
catalog file where no PostgreSQL is installed), in one run: the batch's wall time after ``small`` and after
``10 * small`` earlier commits (an order of magnitude apart), each the median of ``reps`` batches of ``rows``
upserts of existing keys plus ``rows`` new keys (``apply_batch``: the task's data file, the lookup, the
position-delete file, the catalog commit).

Without a compaction every batch adds a data file (the lookup touches more files) and every commit a manifest
and a snapshot (the manifest list and the table's metadata grow; pyiceberg copies the metadata many times per
commit), so the per-batch cost grows with the commits since the last compaction; ratios show by how much on each
store. moto is a Python server: its cost is in every S3 figure, so S3/local compares the code paths on one
machine, not S3's latency.

    python -m bench.bench_iceberg_catalog [--small 10] [--rows 1000] [--reps 5]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from bench._util import table

SEQ_TYPE = pa.decimal128(38, 0)
FIELDS = pa.schema([pa.field("pk", pa.int64()), pa.field("v", pa.string())])


def _batch(keys: np.ndarray, ts: int) -> pa.Table:
    n = len(keys)
    return pa.table({"op": ["insert"] * n, "pk": pa.array(keys, pa.int64()), "v": [f"v{ts}"] * n,
                     "_ts": pa.array(np.full(n, ts, np.int64)), "_seq": pa.array([ts << 64] * n, SEQ_TYPE),
                     "_partition": pa.array(np.zeros(n, np.int64))})


def _grow(t, commits: int, rows: int, state: dict) -> list[float]:
    """``commits`` batches (each ``rows`` upserts of existing keys and ``rows`` new keys); their seconds."""
    from msgstream_spark.mirror import apply_batch

    out = []
    rng = np.random.default_rng(state["ts"])
    for _ in range(commits):
        old = rng.choice(state["next"], size=min(rows, state["next"]), replace=False) if state["next"] else []
        new = np.arange(state["next"], state["next"] + rows)
        state["next"] += rows
        state["ts"] += 1
        keys = np.concatenate([np.asarray(old, np.int64), new])
        t0 = time.perf_counter()
        assert apply_batch(t, _batch(keys, state["ts"]), "pk", "b", state["ts"])
        out.append(time.perf_counter() - t0)
    return out


def _measure(t, small: int, rows: int, reps: int) -> dict[str, float]:
    state = {"next": 0, "ts": 0}
    _grow(t, small, rows, state)
    at_small = statistics.median(_grow(t, reps, rows, state))
    _grow(t, 10 * small - small - reps, rows, state)
    at_large = statistics.median(_grow(t, reps, rows, state))
    return {"batch_s_small": round(at_small, 4), "batch_s_large": round(at_large, 4),
            "large_over_small": round(at_large / at_small, 2)}


def run(small: int = 10, rows: int = 1000, reps: int = 5) -> dict:
    from msgstream_spark.mirror import open_table
    from tests.fixtures.postgres_env import PostgresServer, postgres_bin
    from tests.fixtures.s3_server import S3Server

    tmp = Path(tempfile.mkdtemp(prefix="bench-iceberg-"))
    server = S3Server(tmp, serial=False).start()  # moto's stock threaded server
    bindir = postgres_bin()
    pg = PostgresServer(bindir).start() if bindir else None
    try:
        local = open_table("iceberg", str(tmp / "local"), collection="c", pk="pk", arrow_schema=FIELDS)
        catalog = ({"type": "sql", "uri": pg.create_database()} if pg else
                   {"type": "sql", "uri": f"sqlite:///{tmp / 'catalog.db'}"})
        s3 = open_table("iceberg", f"s3://{server.new_bucket('bench')}/lake/c", collection="c", pk="pk",
                        arrow_schema=FIELDS, catalog="bench", catalog_options=catalog,
                        storage_options=server.options())
        out = {"commits_small": small, "commits_large": 10 * small, "rows_per_batch": 2 * rows,
               "catalog_on_s3": "postgresql" if pg else "sqlite", "local": _measure(local, small, rows, reps),
               "s3": _measure(s3, small, rows, reps)}
    finally:
        if pg:
            pg.stop()
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    out["s3_over_local_small"] = round(out["s3"]["batch_s_small"] / out["local"]["batch_s_small"], 2)
    out["s3_over_local_large"] = round(out["s3"]["batch_s_large"] / out["local"]["batch_s_large"], 2)
    rows_out = [(f"{where}: batch after {n} commits", 1000 * out[where][f"batch_s_{size}"],
                 None if size == "small" else out[where]["large_over_small"])
                for where in ("local", "s3") for size, n in (("small", small), ("large", 10 * small))]
    print(table(rows_out, unit="ms"))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--small", type=int, default=10, help="commits before the first measure (the second: 10x)")
    p.add_argument("--rows", type=int, default=1000, help="upserts and new keys per batch (each)")
    p.add_argument("--reps", type=int, default=5, help="batches measured at each size (median)")
    a = p.parse_args()
    print(json.dumps(run(a.small, a.rows, a.reps), indent=2))


if __name__ == "__main__":
    main()
