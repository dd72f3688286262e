"""Input data for publishing: files (Parquet, CSV, JSON Lines) and a synthetic collection.

Shared by the CLI's ``publish`` and the Spark jobs (which build the same synthetic rows
inside ``mapInArrow``), so both produce identical collections for the same arguments.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.csv as pcsv
import pyarrow.json as pjson
import pyarrow.parquet as pq

from msgstream_spark.errors import ConfigError

FORMATS = ("parquet", "csv", "json")
SYNTHETIC_CATEGORIES = np.array([f"cat-{i}" for i in range(16)], dtype=object)


def synthetic_schema(dim: int) -> pa.Schema:
    """pk int64, category string, score float32, vec list<float32> (``dim`` values)."""
    return pa.schema([("pk", pa.int64()), ("category", pa.string()), ("score", pa.float32()),
                      ("vec", pa.list_(pa.float32()))])


def synthetic_batch(start: int, n: int, dim: int, seed: int = 7) -> pa.RecordBatch:
    """Rows ``start .. start+n-1`` of the synthetic collection, deterministic per row range."""
    pk = np.arange(start, start + n, dtype=np.int64)
    rng = np.random.default_rng([seed, start])
    vec = rng.random((n, dim), dtype=np.float32)
    offsets = np.arange(0, (n + 1) * dim, dim, dtype=np.int32)
    vec_arr = pa.ListArray.from_arrays(pa.array(offsets), pa.array(vec.reshape(-1)))
    category = pa.array(SYNTHETIC_CATEGORIES[pk % len(SYNTHETIC_CATEGORIES)].tolist(), type=pa.string())
    score = pa.array((pk % 1000).astype(np.float32) / np.float32(10.0))
    return pa.RecordBatch.from_arrays([pa.array(pk), category, score, vec_arr], schema=synthetic_schema(dim))


def synthetic_batches(rows: int, dim: int, batch_rows: int = 10_000, start: int = 0, seed: int = 7):
    """Yield the synthetic collection in batches of ``batch_rows``."""
    if rows < 0 or dim <= 0 or batch_rows <= 0:
        raise ConfigError(f"synthetic collection needs rows >= 0, dim > 0, batch rows > 0 "
                          f"(got rows={rows}, dim={dim}, batch rows={batch_rows})")
    for s in range(start, start + rows, batch_rows):
        yield synthetic_batch(s, min(batch_rows, start + rows - s), dim, seed)


def delete_batch(pks, pk_name: str = "pk") -> pa.RecordBatch:
    """A delete change set: ``op='delete'`` for each primary key (int64 or string keys)."""
    keys = pa.array(pks)
    return pa.RecordBatch.from_arrays([pa.array(["delete"] * len(keys), type=pa.string()), keys],
                                      names=["op", pk_name])


def detect_format(path: str, fmt: str | None = None) -> str:
    if fmt:
        f = fmt.lower().replace("jsonl", "json")
        if f not in FORMATS:
            raise ConfigError(f"unknown input format {fmt!r}; expected one of: parquet, csv, json (JSON Lines)")
        return f
    suffix = Path(path).suffix.lower()
    by_suffix = {".parquet": "parquet", ".pq": "parquet", ".csv": "csv", ".json": "json", ".jsonl": "json",
                 ".ndjson": "json"}
    if suffix not in by_suffix:
        raise ConfigError(f"cannot tell the format of {path} from its suffix; pass --format parquet|csv|json")
    return by_suffix[suffix]


def read_table(path: str, fmt: str | None = None) -> pa.Table:
    """Read a Parquet, CSV or JSON Lines file into an Arrow table (clear error on failure)."""
    p = Path(path)
    if not p.exists():
        raise ConfigError(f"input file not found: {path}")
    f = detect_format(path, fmt)
    try:
        if f == "parquet":
            return pq.read_table(p)
        if f == "csv":
            return pcsv.read_csv(p)
        return pjson.read_json(p)
    except (pa.ArrowException, OSError) as exc:
        raise ConfigError(f"cannot read {f} file {path}: {exc}") from exc
