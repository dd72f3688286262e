"""Is the mirrored table equal to the collection? Digests per bucket, then keys where buckets differ.

Order of reads (:func:`verify`): the table is pinned first (a version, and the position in the log it is
complete up to, its watermark P: :mod:`~msgstream_spark.mirror.watermark`); then S, the channels' newest
Milvus time, and the collection is read at least at S; then E, the channels' ends. The table is
Milvus's state at P and the read is Milvus's state at some time in [S, E], so any key whose state
differs between them because of Milvus's own writes has a change in the log in (P, E]: those keys are
"in flux", reported apart and never as errors. Every other difference is the table's.

Both sides reduce to ``(count, sum of row hashes mod 2^64)`` per partition and bucket of the key's
hash (:mod:`~msgstream_spark.mirror.verify.digest`, column-wise); only buckets whose digests differ are
compared key by key. A key differs as ``missing`` (in Milvus, not in the table), ``extra`` (in the
table only: e.g. a dropped key's row), ``stale`` (another version of the row) or ``duplicated`` (more
than one row in the table).
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from msgstream_spark.mirror.common import PARTITION, TS
from msgstream_spark.mirror.order import SEQ
from msgstream_spark.mirror.verify.digest import Digest, key_hashes, row_hashes

KINDS = ("missing", "extra", "stale", "duplicated")
FLUX = "in_flux"
DEFAULT_BUCKETS = 1024
_H = "__row_hash"


@dataclass
class Reduced:
    """One side: its digest and, per row, key, bucket and row hash (24 bytes a row; values are dropped)."""

    pk: str
    buckets: int
    by_partition: bool
    digest: Digest = None  # type: ignore[assignment]
    keys: list[pa.Array] = field(default_factory=list)
    groups: list[np.ndarray] = field(default_factory=list)
    hashes: list[np.ndarray] = field(default_factory=list)
    rows: int = 0
    bytes: int = 0

    def __post_init__(self) -> None:
        self.digest = Digest(self.buckets)

    def add(self, batch: pa.RecordBatch, columns: list[str], json_columns: Iterable[str]) -> None:
        if batch.num_rows == 0:
            return
        keys = batch.column(self.pk)
        bucket = (key_hashes(keys) % np.uint64(self.buckets)).astype(np.int64)
        h = row_hashes(batch, columns, json_columns)
        part = None
        if self.by_partition:
            part = batch.column(PARTITION).fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
        self.digest.add(part, bucket, h)
        self.keys.append(keys)
        self.groups.append(bucket if part is None else part * self.buckets + bucket)
        self.hashes.append(h)
        self.rows += batch.num_rows
        self.bytes += batch.nbytes

    def rows_in(self, groups: list[tuple[int | None, int]]) -> pa.Table:
        """(key, row hash) of the rows in ``groups`` (a (partition, bucket) list)."""
        want = np.array([(p or 0) * self.buckets + b if self.by_partition else b for p, b in groups], dtype=np.int64)
        keys, hashes = [], []
        for k, g, h in zip(self.keys, self.groups, self.hashes):
            m = np.isin(g, want)
            if m.any():
                keys.append(pc.filter(k, pa.array(m)))
                hashes.append(h[m])
        if not keys:
            return pa.table({self.pk: pa.array([], self.keys[0].type if self.keys else pa.int64()),
                             _H: pa.array([], pa.uint64())})
        ktype = keys[0].type
        return pa.table({self.pk: pa.concat_arrays([k.cast(ktype) for k in keys]),
                         _H: pa.array(np.concatenate(hashes), pa.uint64())})


def reduce_side(batches: Iterator[pa.RecordBatch], pk: str, columns: list[str], json_columns: Iterable[str],
                buckets: int, by_partition: bool) -> Reduced:
    r = Reduced(pk, buckets, by_partition)
    for b in batches:
        r.add(b, columns, json_columns)
    return r


def hashed_columns(schema: pa.Schema, by_partition: bool) -> list[str]:
    """The key and every field (and the partition where both sides know it); not ``_ts``/``_seq``."""
    return [n for n in schema.names if n not in (TS, SEQ, PARTITION)] + ([PARTITION] if by_partition else [])


def compare(milvus: Reduced, table: Reduced) -> tuple[list[dict[str, Any]], int]:
    """The differing keys (``{"kind", "pk"}``) and the number of differing buckets."""
    groups = milvus.digest.differing(table.digest)
    if not groups:
        return [], 0
    pk = milvus.pk
    m = milvus.rows_in(groups)
    t = table.rows_in(groups)
    t = t.set_column(0, pk, t.column(pk).cast(m.schema.field(pk).type))
    tg = t.group_by(pk).aggregate([(_H, "count"), (_H, "min"), (_H, "max")])
    joined = m.rename_columns([pk, "__m"]).join(tg, pk, join_type="full outer")
    out = []
    for r in joined.to_pylist():  # only the rows of differing buckets
        n = r.get(f"{_H}_count") or 0
        if n > 1:
            kind = "duplicated"
        elif r["__m"] is None:
            kind = "extra"
        elif n == 0:
            kind = "missing"
        elif r[f"{_H}_min"] != r["__m"]:
            kind = "stale"
        else:
            continue
        out.append({"kind": kind, "pk": r[pk]})
    out.sort(key=lambda p: (KINDS.index(p["kind"]), str(p["pk"])))
    return out, len(groups)


@dataclass
class Result:
    problems: list[dict[str, Any]]
    in_flux: list[dict[str, Any]]
    summary: dict[str, Any]

    @property
    def equal(self) -> bool:
        return not self.problems

    def lines(self) -> Iterator[dict[str, Any]]:
        """The report: one JSON object per key, then the summary."""
        yield from self.problems
        yield from self.in_flux
        yield {"summary": self.summary}


def split_flux(problems: list[dict[str, Any]], changed: set) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(errors, keys in flux): a differing key with a change in the log after the table's watermark is in flux."""
    errors, flux = [], []
    for p in problems:
        if p["pk"] in changed:
            flux.append({"kind": FLUX, "pk": p["pk"], "was": p["kind"]})
        else:
            errors.append(p)
    return errors, flux


def summarize(errors: list[dict[str, Any]], flux: list[dict[str, Any]], milvus: Reduced, table: Reduced,
              differing: int, started: float, **extra: Any) -> dict[str, Any]:
    counts = {k: sum(1 for p in errors if p["kind"] == k) for k in KINDS}
    return {"equal": not errors, **counts, FLUX: len(flux),
            "rows": {"milvus": milvus.rows, "table": table.rows},
            "bytes": {"milvus": milvus.bytes, "table": table.bytes},
            "buckets": milvus.buckets, "buckets_differing": differing,
            "seconds": round(time.perf_counter() - started, 3), **extra}
