"""``make bench``'s Spark scripts still run against the product (they broke unseen once: the rows schema
gained ``_seq`` and the synthetic baseline did not). Tiny sizes, one subprocess: no figure is judged here."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.fixtures.login_env import login_env

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parents[2]
SCRIPT = """
import json
from bench import bench_freshness, bench_spark_read, bench_spark_write, profile_split
out = {"read": bench_spark_read.run(rows=4000, mem_rows=0, kafka=False),
       "write": bench_spark_write.run(rows=2000, dim=8, reps=1),
       "split": profile_split.run(rows=20000, reps=1),
       "fresh": bench_freshness.run(small=100, large=1000, samples=2, interval=0.5, kafka=False)}  # stops Spark
print("RESULT " + json.dumps(out, default=str))
"""


def test_the_spark_bench_scripts_run_and_report_their_ratios():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, env=login_env(), capture_output=True,
                          text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT "))
    got = json.loads(line[len("RESULT "):])
    assert got["read"]["local_vs_synthetic"] > 0 and got["read"]["streaming_vs_synthetic_parquet"] > 0
    assert got["write"], got
    split = got["split"]
    assert split["ratio"] > 0 and split["1 task"]["all_cores"] > 0 and split["2 tasks"]["all_cores"] > 0
    fresh = got["fresh"]["local"]
    assert fresh["small"]["rows"] == 100 and fresh["large"]["rows"] == 1000 and fresh["p50_ratio_large_small"] > 0
