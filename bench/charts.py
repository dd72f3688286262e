"""PNG charts of one ``make bench`` run: the ratios against their goals, and how the read scales.

    python -m bench.charts [bench/results/all.json]

Writes bench/results/ratios.png (bars, goal marks) and bench/results/scaling.png.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

OUT = Path("bench/results")


def ratio_rows(res: dict) -> list[tuple[str, float, float | None]]:
    """(label, measured ratio, goal) for every ratio of the run; higher is better for all of them
    (the decode ratio is the baseline's time over decode's time; a cost ratio with a goal <= G is drawn as
    G / ratio against 1). Goal None: a figure with no goal, drawn grey without a mark."""
    rows: list[tuple[str, float, float | None]] = []
    k = res.get("bench.bench_kafka") or {}
    for size, label in (("1024B", "1 KiB"), ("65536B", "64 KiB")):
        r = k.get(size) or {}
        if "consume_raw_ratio" in r:
            rows.append((f"Kafka consume (bulk receive_raw), {label}", r["consume_raw_ratio"], 0.9))
        if "consume_ratio" in r:
            rows.append((f"Kafka consume (receive_batch), {label}", r["consume_ratio"], 0.9))
        if "produce_ratio" in r:
            rows.append((f"Kafka produce, {label}", r["produce_ratio"], 0.9))
    c = res.get("bench.bench_codec") or {}
    if c.get("decode_time_vs_baseline"):
        rows.append(("decode (baseline time / decode time)", 1 / c["decode_time_vs_baseline"], 1 / 1.2))
    d26 = res.get("bench.bench_decode26") or {}
    if d26.get("decode_v26_time_vs_v25"):
        rows.append(("2.6 decode (2.5 time / 2.6 time, same inserts)", 1 / d26["decode_v26_time_vs_v25"], 1 / 1.5))
    shape = res.get("bench.bench_read_shape") or {}
    for key, label in (("plan_local", "embedded log"), ("plan_kafka", "Kafka"), ("plan_pulsar", "Pulsar")):
        if (shape.get(key) or {}).get("ratio"):
            rows.append((f"planning, {label}: 100k-row time / 10M-row time", 1 / shape[key]["ratio"], 1 / 1.2))
        if (shape.get(key) or {}).get("ratio_first"):
            rows.append(("  same, a first plan (nothing scanned yet)", 1 / shape[key]["ratio_first"], 1 / 1.2))
    if (shape.get("channels") or {}).get("ratio"):
        rows.append(("Spark read, 16 channels vs 2 (same rows)", shape["channels"]["ratio"], 0.9))
    if (shape.get("split") or {}).get("ratio"):
        rows.append(("Spark read, one channel: 2 tasks vs 1", shape["split"]["ratio"], 1.5))
    s = res.get("bench.bench_spark_read") or {}
    for key, label, goal in (("local_vs_synthetic", "Spark read, embedded log vs synthetic", 0.8),
                             ("local_collection_opt_vs_synthetic", "  same, with option collection", 0.8),
                             ("kafka_vs_synthetic", "Spark read, Kafka vs synthetic", 0.7),
                             ("kafka_collection_opt_vs_synthetic", "  same, with option collection", 0.7),
                             ("streaming_vs_synthetic_parquet", "streaming -> parquet vs synthetic", 0.8)):
        if s.get(key):
            rows.append((label, s[key], goal))
    w = res.get("bench.bench_spark_write") or {}
    for be, goal in (("local", 0.7), ("kafka", 0.85)):
        if (w.get(be) or {}).get("ratio"):
            rows.append((f"Spark write, {'embedded log' if be == 'local' else 'Kafka'} vs bare produce",
                         w[be]["ratio"], goal))
    m = res.get("bench.bench_mirror") or {}
    for fmt in ("delta", "iceberg"):  # #27: >= 0.6 of appending the same events to Parquet
        if (m.get("mirror") or {}).get(f"mirror_{fmt}_ratio"):
            rows.append((f"mirror into {fmt} vs append to Parquet (goal >= 0.6)", m["mirror"][f"mirror_{fmt}_ratio"],
                         0.6))
    sc = res.get("bench.bench_mirror_scale") or {}
    for fmt in ("delta", "iceberg"):
        for kind, goal in (("mixed", 1.5), ("insert_only", 1.2)):
            r = (sc.get(fmt) or {}).get(kind) or {}
            if r.get("ratio"):  # a cost ratio: lower is better, drawn as goal / ratio against 1
                rows.append((f"mirror {fmt} {kind} batch, table 8x / 1x rows (goal <= {goal}x, as {goal} / ratio)",
                             round(goal / r["ratio"], 2), 1.0))
        reads = (sc.get(fmt) or {}).get("reads") or {}
        if reads.get("read_ratio"):  # no goal in #27: what merge-on-read costs readers until a compaction
            rows.append((f"mirror {fmt} full read, compacted / after {reads.get('batches', 50)} update batches "
                         "(time; no goal)", round(1 / reads["read_ratio"], 2), None))
    rows += _store_rows(m, sc, res.get("bench.bench_freshness") or {})
    dr = res.get("bench.bench_mirror_driver") or {}
    for key, what in (("heap_ratio", "JVM live heap"), ("rss_ratio", "Python RSS")):
        if dr.get(key):
            rows.append((f"mirror driver {what}, 10x batch (goal <= 1.2x, as 1.2 / ratio)", round(1.2 / dr[key], 2),
                         1.0))
    if (m.get("snapshot") or {}).get("snapshot_ratio"):
        rows.append(("snapshot (real Milvus) vs append the log to Parquet", m["snapshot"]["snapshot_ratio"], 0.5))
    rows += _many_rows(res.get("bench.bench_mirror_many") or {})
    return rows


def _many_rows(mm: dict) -> list[tuple[str, float, float | None]]:
    """#44: one database job vs one job per collection (goal >= 5) and vs one job over one table (goal 1/1.3)."""
    rows: list[tuple[str, float, float | None]] = []
    for fmt in ("delta", "iceberg"):
        for phase in ("load", "changes"):
            r = (mm.get(fmt) or {}).get(phase) or {}
            if (r.get("separate_vs_database") or {}).get("ratio"):
                rows.append((f"mirror {fmt} {phase}: one job per collection / one database job (time)",
                             r["separate_vs_database"]["ratio"], 5.0))
            if (r.get("one_vs_database") or {}).get("ratio"):
                rows.append((f"mirror {fmt} {phase}: one job, one table / one database job (time)",
                             r["one_vs_database"]["ratio"], round(1 / 1.3, 3)))
    return rows


def _store_rows(m: dict, sc: dict, fr: dict) -> list[tuple[str, float, float | None]]:
    """The mirror's figures on the S3 server (moto): the job vs into a local path, a batch's time and bytes
    fetched at 8x the rows, freshness with 4M rows."""
    rows: list[tuple[str, float, float | None]] = []
    for fmt in ("delta", "iceberg"):
        r = (m.get("store") or {}).get(fmt) or {}
        if r.get("ratio"):
            rows.append((f"mirror into {fmt} on S3 vs into a local path (goal >= 0.7)", r["ratio"], 0.7))
    for fmt in ("delta", "iceberg"):
        r = (sc.get("s3") or {}).get(fmt) or {}
        for kind, key, goal, what in (("warm", "time", 1.5, "time"), ("insert_only", "time", 1.2, "insert-only time"),
                                      ("warm", "get_bytes", 1.2, "bytes fetched, warm key cache"),
                                      ("cold", "get_bytes", None, "bytes fetched, cold key cache")):
            q = ((((r.get("batches") or {}).get(kind)) or {}).get("ratio") or {}).get(key)
            if q:
                g = f"goal <= {goal}x, as {goal} / ratio" if goal else "no goal, as 1.2 / ratio"
                rows.append((f"mirror {fmt} on S3, batch {what}, 8x / 1x rows ({g})", round((goal or 1.2) / q, 2),
                             1.0 if goal else None))
    p50 = ((fr.get("local_s3") or {}).get("large") or {}).get("p50_s")
    if p50:
        rows.append(("freshness on S3, 4M-row table: p50 (goal <= 3 s, as 3 s / p50)", round(3.0 / p50, 2), 1.0))
    return rows


def spreads(res: dict) -> dict[str, dict]:
    """The figures measured over several interleaved runs (bench/_util.figure), by their ratio_rows label:
    their spread and verdict (the chart draws the spread as a bar and a figure within noise in amber)."""
    out: dict[str, dict] = {}
    s = res.get("bench.bench_spark_read") or {}
    for key, label in (("local_figure", "Spark read, embedded log vs synthetic"),
                       ("kafka_figure", "Spark read, Kafka vs synthetic")):
        if s.get(key):
            out[label] = s[key]
    shape = res.get("bench.bench_read_shape") or {}
    if (shape.get("channels") or {}).get("figure"):
        out["Spark read, 16 channels vs 2 (same rows)"] = shape["channels"]["figure"]
    if (shape.get("split") or {}).get("figure"):
        out["Spark read, one channel: 2 tasks vs 1"] = shape["split"]["figure"]
    w = res.get("bench.bench_spark_write") or {}
    for be in ("local", "kafka"):
        if (w.get(be) or {}).get("figure"):
            out[f"Spark write, {'embedded log' if be == 'local' else 'Kafka'} vs bare produce"] = w[be]["figure"]
    return out


def ratios_chart(res: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = ratio_rows(res)
    if not rows:
        return
    labels = [r[0] for r in rows][::-1]
    vals = [r[1] for r in rows][::-1]
    goals = [r[2] for r in rows][::-1]
    figs = spreads(res)
    colors = ["#757575" if g is None else "#ef6c00" if (figs.get(lb) or {}).get("verdict") == "within noise"
              else "#2e7d32" if v >= g else "#c62828" for lb, v, g in zip(labels, vals, goals)]
    fig, ax = plt.subplots(figsize=(12, 0.42 * len(rows) + 1.4))
    y = range(len(rows))
    ax.barh(list(y), vals, color=colors)
    for i, (v, g) in enumerate(zip(vals, goals)):
        if g is not None:
            ax.plot([g, g], [i - 0.42, i + 0.42], color="black", lw=2)
        lb = labels[i]
        if lb in figs:  # the spread over the interleaved runs
            lo, hi = figs[lb]["spread"]
            ax.plot([lo, hi], [i, i], color="black", lw=1)
        ax.text(max(v, figs[lb]["spread"][1] if lb in figs else v) + 0.01, i, f"{v:.2f}", va="center", fontsize=8)
    ax.set_yticks(list(y), labels, fontsize=8)
    ax.set_xlabel("ratio to the same-run baseline (black mark: goal; thin line: spread over the runs; green: met; "
                  "amber: within noise; grey: no goal)")
    ax.set_title("msgstream-spark throughput against its baselines (make bench)")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def scaling_chart(scaling: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    cases = scaling.get("cases") or []
    if not cases:
        return
    fig, axes = plt.subplots(1, 3, figsize=(13, 3.8))
    masters = sorted({c["master"] for c in cases})
    by_rows = [c for c in cases if c["channels"] == 2]
    by_ch = [c for c in cases if c["rows"] == min(c2["rows"] for c2 in cases)]
    for m in masters:
        pts = sorted((c["rows"], c["rows_s"], c["worker_peak_rss_mb"], c["worker_peak_anon_mb"])
                     for c in by_rows if c["master"] == m)
        axes[0].plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=m)
        axes[1].plot([p[0] for p in pts], [p[2] for p in pts], "o-", label=f"{m} RSS")
        axes[1].plot([p[0] for p in pts], [p[3] for p in pts], "s--", label=f"{m} anonymous (not file-backed)")
        pts = sorted((c["channels"], c["rows_s"]) for c in by_ch if c["master"] == m)
        axes[2].plot([p[0] for p in pts], [p[1] for p in pts], "o-", label=m)
    axes[0].set(xscale="log", xlabel="rows read (2 channels)", ylabel="rows/s", title="read rate by log size")
    axes[1].set(xscale="log", xlabel="rows read (2 channels)", ylabel="MB", title="Python worker peak memory")
    axes[2].set(xscale="log", xlabel="channels", ylabel="rows/s", title="read rate by channel count")
    for ax in axes:
        ax.set_ylim(bottom=0)
        ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    args = argv if argv is not None else sys.argv[1:]
    res = json.loads(Path(args[0] if args else OUT / "all.json").read_text())
    OUT.mkdir(parents=True, exist_ok=True)
    ratios_chart(res, OUT / "ratios.png")
    scaling_chart(res.get("bench.bench_scaling") or {}, OUT / "scaling.png")
    for label, v, goal in ratio_rows(res):
        verdict = "no goal" if goal is None else f"goal {goal:.2f}  {'met' if v >= goal else 'NOT met'}"
        print(f"{label:<52} {v:6.2f}  {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
