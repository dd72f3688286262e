"""The long run (issue #44, "How it is measured"): a mirror table's per-batch cost as its history grows, with the
job's maintenance policy (its defaults: ``mirror.upkeep.Upkeep`` after every batch, as ``msgstream mirror run``
does) against the same batches without maintenance, both formats, in one run.

Each batch is ``changes`` changes (half upserts of existing keys, half new keys) through ``apply_batch`` (the
driver's write path without Spark: the task's data file, the lookup, the deletes, the commit) and then, on the
maintained table, the policy's due tasks (their time counted in the batch's). Figures per format and table:
the median batch time of the last 100 batches against batches 11-110 (``bench._util.figure``: the early series
over the late one, so a ratio below 1 means later batches are slower; goal >= 1/1.2: later batches at most
1.2x the early ones), and the table's metadata bytes (Delta log, Iceberg metadata directory) at the end
against at ``mid`` batches (goal <= 1.5x; also the most of the last 100 batches against the most of the 100
before ``mid``: both are a sawtooth, cut at each expiry and, for Delta, at checkpoints).

    python -m bench.bench_mirror_upkeep [--batches 300] [--changes 100] [--formats delta,iceberg] [--s3]
                                        [--mid N] [--no-baseline]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

from bench._util import describe, figure, table

SEQ_TYPE = pa.decimal128(38, 0)
FIELDS = pa.schema([pa.field("pk", pa.int64()), pa.field("v", pa.string())])
WINDOW = 100  # batches in each series (11-110 and the last 100)


def _batch(keys: np.ndarray, ts: int) -> pa.Table:
    n = len(keys)
    return pa.table({"op": ["insert"] * n, "pk": pa.array(keys, pa.int64()), "v": [f"v{ts}"] * n,
                     "_ts": pa.array(np.full(n, ts, np.int64)), "_seq": pa.array([ts << 64] * n, SEQ_TYPE),
                     "_partition": pa.array(np.zeros(n, np.int64))})


def _run_one(t, batches: int, changes: int, maintained: bool, mid: int, progress=None) -> dict:
    """``batches`` batches into table ``t`` (with the default policy's maintenance when ``maintained``): each
    batch's seconds, the metadata bytes at ``mid`` and at the end; ``progress``: a file each batch's seconds
    (and every 10th batch's metadata figures) are appended to as a JSON line, so a run stopped early still
    says how far it came."""
    from msgstream_spark.mirror import apply_batch
    from msgstream_spark.mirror.formats import registry
    from msgstream_spark.mirror.store.writer import writer_lock
    from msgstream_spark.mirror.upkeep import Upkeep

    up = Upkeep(t) if maintained else None
    fmts = registry.upkeep(t)
    rng = np.random.default_rng(7)
    nxt, secs, meta = 0, [], {}
    # the table's writer lease held for the run, as `mirror run` holds it for the job (the batches and the
    # maintenance join it): not taken again by every batch and every maintenance pass, each taking listing the
    # table's objects (on S3 a listing that grows with the table) and each expiry publishing a new epoch
    with writer_lock(t.store, t.location, "bench_mirror_upkeep") as hold:
        for b in range(1, batches + 1):
            old = rng.choice(nxt, size=min(changes // 2, nxt), replace=False) if nxt else np.zeros(0, np.int64)
            new = np.arange(nxt, nxt + changes - len(old))
            nxt += len(new)
            t0 = time.perf_counter()
            assert apply_batch(t, _batch(np.concatenate([old.astype(np.int64), new]), b), "pk", "q", b)
            if up is not None:
                up.after_batch(None, hold)
            secs.append(time.perf_counter() - t0)
            if b % 10 == 0 or b in (mid, batches):  # (outside the batch's time)
                meta[b] = fmts.figures(t)
            if progress is not None:
                progress.write(json.dumps({"batch": b, "s": round(secs[-1], 4), **({"meta": meta[b]} if b in meta
                                                                                  else {})}) + "\n")
                progress.flush()
    window = max(1, min(WINDOW, batches - mid))
    peak = {"mid": max(v["metadata_bytes"] for k, v in meta.items() if mid - window < k <= mid),
            "end": max(v["metadata_bytes"] for k, v in meta.items() if k > batches - window)}
    out = {"batch_s": [round(s, 4) for s in secs], "meta_mid": meta[mid], "meta_end": meta[batches],
           "meta_peak": peak, "rows": t.to_arrow().num_rows, "keys": nxt}
    if up is not None:
        out["maintenance"] = {"runs": up.runs, "errors": up.errors, "seconds": up.seconds}
    return out


def _open(fmt: str, where: Path | None, s3, name: str):
    from msgstream_spark.mirror import open_table

    if s3 is None:
        return open_table(fmt, str(where / name), collection="c", pk="pk", arrow_schema=FIELDS)
    more = {"catalog_uri": f"sqlite:///{where / (name + '.sqlite')}"} if fmt == "iceberg" else {}
    return open_table(fmt, f"s3://{s3.new_bucket(name.replace('_', '-'))}/t", collection="c", pk="pk",
                      arrow_schema=FIELDS, storage_options=s3.options(), **more)


def _figures(r: dict, batches: int, mid: int) -> dict:
    early, late = r["batch_s"][10:10 + WINDOW], r["batch_s"][-WINDOW:]
    fig = figure(early, late, goal=round(1 / 1.2, 3))
    growth = r["meta_end"]["metadata_bytes"] / max(1, r["meta_mid"]["metadata_bytes"])
    return {"late_over_early": round(statistics.median(late) / statistics.median(early), 3), "figure": fig,
            "median_early_s": round(statistics.median(early), 4), "median_late_s": round(statistics.median(late), 4),
            "metadata_bytes_mid": r["meta_mid"]["metadata_bytes"],
            "metadata_bytes_end": r["meta_end"]["metadata_bytes"],
            "metadata_end_over_mid": round(growth, 3), "metadata_goal_met": growth <= 1.5,
            # the log and metadata are a sawtooth (Delta: cut at checkpoints, every 100 versions): the most of
            # the last 100 batches against the most of the 100 before mid
            "metadata_peak_end_over_mid": round(r["meta_peak"]["end"] / max(1, r["meta_peak"]["mid"]), 3),
            "versions_end": r["meta_end"]["versions"], "metadata_files_end": r["meta_end"]["metadata_files"]}


def run(batches: int = 300, changes: int = 100, formats: tuple[str, ...] = ("delta", "iceberg"),
        s3: bool = False, mid: int | None = None, baseline: bool = True, progress: str | None = None) -> dict:
    if batches < 10 + WINDOW:
        raise SystemExit(f"--batches must be at least {10 + WINDOW} (batches 11-110 are the early series)")
    mid = mid or max(WINDOW, min(500, batches // 2 // 100 * 100))  # a multiple of 100: a checkpoint's phase
    tmp = Path(tempfile.mkdtemp(prefix="bench-upkeep-"))
    server = None
    if s3:
        from tests.fixtures.s3_server import S3Server

        server = S3Server(tmp, serial=False).start()
    out: dict = {"batches": batches, "changes_per_batch": changes, "mid": mid, "store": "s3" if s3 else "local"}
    try:
        for fmt in formats:
            for maintained in (False, True) if baseline else (True,):
                name = f"{fmt}_{'policy' if maintained else 'none'}"
                with open(f"{progress}.{name}", "a") if progress else contextlib.nullcontext() as lines:
                    raw = _run_one(_open(fmt, tmp, server, name), batches, changes, maintained, mid, lines)
                out[name] = {**_figures(raw, batches, mid), "maintenance": raw.get("maintenance"),
                             "rows": raw["rows"], "keys": raw["keys"]}
                print(f"{name}: late/early {out[name]['late_over_early']}, early/late "
                      f"{describe(out[name]['figure'])}, metadata end/mid {out[name]['metadata_end_over_mid']}",
                      flush=True)
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    rows = [(f"{n}: median of the last {WINDOW} batches", 1000 * v["median_late_s"], v["late_over_early"])
            for n, v in out.items() if isinstance(v, dict) and "median_late_s" in v]
    print(table(rows, unit="ms"))
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batches", type=int, default=300, help="batches per table (the issue's long run: 2000)")
    p.add_argument("--changes", type=int, default=100, help="changes per batch")
    p.add_argument("--formats", default="delta,iceberg")
    p.add_argument("--mid", type=int, help="the batch whose metadata bytes the end's are compared to "
                                           "(default: min(500, batches / 2), rounded down to a multiple of 100)")
    p.add_argument("--s3", action="store_true", help="on moto's S3 server instead of a local directory")
    p.add_argument("--no-baseline", dest="baseline", action="store_false",
                   help="the maintained tables only (an unmaintained Iceberg table at 2,000 batches takes an hour)")
    p.add_argument("--progress", metavar="FILE", help="append each batch's seconds to FILE.<table> as JSON lines")
    a = p.parse_args()
    print(json.dumps(run(a.batches, a.changes, tuple(a.formats.split(",")), a.s3, a.mid, a.baseline, a.progress),
                     indent=2))


if __name__ == "__main__":
    main()
