"""``make bench``'s Spark scripts still run against the product (they broke unseen once: the rows schema
gained ``_seq`` and the synthetic baseline did not), also their S3 parts (moto's server started as the bench
starts it). Tiny sizes, one subprocess: no figure is judged here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bench.charts import ratio_rows
from tests.fixtures.login_env import login_env

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
# The scripts at tiny sizes share one SparkSession (each getOrCreates it; made here with bench_spark_read's settings),
# the msgstream source registered in it from Python as the jobs register it (jobs/_common.spark_session): Spark keeps
# its Python processes (planners, workers) in pools by their environment, which differs between a source found by
# Spark's lookup and a registered one, so bench_spark_read's reads and the synthetic source's would start a set of
# each (~5 s of CPU). profile_split leaves the session running (stop=False: a new one would start all again) and
# bench_freshness stops it at the end. Sizes and counts are the smallest that give every figure checked below:
# one rep and no untimed warm-up reads, Kafka and the mirror part's Iceberg run left out (the S3 part runs both
# formats), one freshness sample, the table polled every 0.2 s (not 0.05: on S3 each look is moto's requests).
SCRIPT = """
import json, sys
from pyspark.sql import SparkSession
from bench import bench_freshness, bench_mirror, bench_spark_read, bench_spark_write, profile_split
from msgstream_spark.spark.datasource import MsgStreamDataSource
spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
         .config("spark.ui.showConsoleProgress", "false").config("spark.sql.shuffle.partitions", "2").getOrCreate())
spark.dataSource.register(MsgStreamDataSource)
out = {"read": bench_spark_read.run(rows=4000, mem_rows=0, kafka=False, reps=1, out_dir=sys.argv[1], warmup=False),
       "write": bench_spark_write.run(rows=2000, dim=8, reps=1, kafka=False),
       "split": profile_split.run(rows=20000, reps=1, stop=False, warmup=False),
       "mirror": bench_mirror.run(rows=2000, snapshot_rows=0, reps=1, mirror_formats=("delta",)),
       "fresh": bench_freshness.run(small=100, large=1000, samples=1, interval=0, kafka=False, poll=0.2)}  # stops Spark
print("RESULT " + json.dumps(out, default=str))
"""


def test_the_spark_bench_scripts_run_and_report_their_ratios(tmp_path, python_forks):
    proc = subprocess.run([sys.executable, "-c", SCRIPT, str(tmp_path)], cwd=REPO, env=login_env(),
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    got = json.loads(line[len("RESULT "):])
    assert got["read"]["local_vs_synthetic"] > 0 and got["read"]["streaming_vs_synthetic_parquet"] > 0
    # its JSON and chart written where it was told (not into the checkout's bench/results)
    assert json.loads((tmp_path / "spark_read.json").read_text())["rows"] == 4000
    assert (tmp_path / "spark_read.png").stat().st_size > 0
    assert got["write"], got
    split = got["split"]
    assert split["ratio"] > 0 and split["1 task"]["all_cores"] > 0 and split["2 tasks"]["all_cores"] > 0
    fresh = got["fresh"]["local"]
    assert fresh["small"]["rows"] == 100 and fresh["large"]["rows"] == 1000 and fresh["p50_ratio_large_small"] > 0
    on_s3 = got["fresh"]["local_s3"]
    assert on_s3["large"]["store"] == "s3" and on_s3["large"]["rows"] == 1000 and on_s3["p50_ratio_s3_local_large"] > 0
    mirror = got["mirror"]
    assert mirror["mirror"]["mirror_delta_ratio"] > 0
    for fmt in ("delta", "iceberg"):  # the job into s3:// and into a local path, what it moved through the store
        f = mirror["store"][fmt]
        assert f.get("ratio", 0) > 0, f
        run = f["runs"]["s3"][0]
        assert run["step_bytes"]["write"]["written"] > 0 and run["served"]["put_bytes"] > 0, run
    labels = [r[0] for r in ratio_rows({"bench.bench_mirror": mirror, "bench.bench_freshness": got["fresh"]})]
    assert any("on S3 vs into a local path" in lb for lb in labels) and any("freshness on S3" in lb for lb in labels)


SCALE = """
import json
from bench import bench_mirror_scale
print("RESULT " + json.dumps(bench_mirror_scale.run(small=2000, batch=200, reps=1, updates_table=1000,
                                                    update_batches=2)))
"""


def test_the_scale_bench_runs_on_a_local_path_and_on_the_s3_server(python_forks):
    proc = subprocess.run([sys.executable, "-c", SCALE], cwd=REPO, env=login_env(), capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    got = json.loads(next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))[len("RESULT "):])
    for fmt in ("delta", "iceberg"):
        assert got[fmt]["mixed"]["ratio"] > 0 and got[fmt]["reads"]["read_ratio"] > 0
        s3 = got["s3"][fmt]["batches"]
        for kind in ("first", "cold", "warm", "insert_only"):
            assert s3[kind]["ratio"]["time"] > 0 and s3[kind]["large"]["get_bytes"] > 0, (fmt, kind, s3[kind])
        # a cold executor fetches key index blocks that a warm one has in its cache
        cold, warm = s3["cold"]["large"]["get_bytes_by_kind"], s3["warm"]["large"]["get_bytes_by_kind"]
        assert cold["key_index"] > warm.get("key_index", 0), (fmt, cold, warm)
    labels = [r[0] for r in ratio_rows({"bench.bench_mirror_scale": got})]  # make bench's chart reads them
    assert any("on S3, batch bytes fetched, warm" in lb for lb in labels), labels
