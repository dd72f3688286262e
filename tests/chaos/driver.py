"""A Spark driver of its own, run as a subprocess (from a directory outside the repo) so the
chaos tests can SIGKILL it, or SIGKILL one of its Python workers, at random moments.

    python driver.py '<json spec>'

spec: master, mode (``read`` msgstream -> parquet; ``write`` msgstream -> msgstream sink;
``batch`` one bounded read -> parquet), options (source), sink_options (``write``), out, chk,
trigger (``processing`` | ``available``), max_rows (per trigger).
It imports only pyspark and the installed package, as a user's job does.
"""

from __future__ import annotations

import json
import os
import sys
import time

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
T0 = time.time()


def mark(what: str) -> None:
    """A timestamped phase line in the driver's log (the tests' logs show where a (re)start's time went)."""
    print(f"[phase] {what} t={time.time():.3f} (+{time.time() - T0:.1f}s)", flush=True)


def session(master: str):
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master(master).config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").config("spark.python.worker.reuse", "true")
             .getOrCreate())
    spark.sparkContext.setLogLevel("WARN")
    # Registered explicitly: with main's editable install (an import hook) pyspark's pkgutil scan does
    # not see pyspark_msgstream from outside the repo; branch `connect` fixes that in pyproject.toml.
    from msgstream_spark.spark.datasource import MsgStreamDataSource

    spark.dataSource.register(MsgStreamDataSource)
    return spark


def start_query(spark, spec: dict):
    """The streaming query of a ``read`` or ``write`` spec, started in ``spark``. The chaos tests also call it in
    their own session for the last restart (the drain), so killed and restarted drivers run the same query."""
    src = spark.readStream.format("msgstream").options(**spec["options"])
    if spec.get("max_rows"):
        src = src.option("maxRowsPerTrigger", str(spec["max_rows"]))
    df = src.load()
    if spec["mode"] == "write":
        w = df.writeStream.format("msgstream").options(**spec["sink_options"])
    else:
        w = df.writeStream.format("parquet").option("path", spec["out"])
    w = w.option("checkpointLocation", spec["chk"])
    if spec.get("trigger") == "available":
        w = w.trigger(availableNow=True)
    else:
        w = w.trigger(processingTime="300 milliseconds")
    return w.start()


def main() -> None:
    spec = json.loads(sys.argv[1])
    spark = session(spec.get("master", "local[2]"))
    mark("session")
    opts = spec["options"]
    if spec["mode"] == "phases":
        phases(spark, spec)
        return
    if spec["mode"] == "batch":
        df = spark.read.format("msgstream").options(**opts).load()
        df.write.mode("overwrite").parquet(spec["out"])
        print("done", flush=True)
        return
    q = start_query(spark, spec)
    print("started", flush=True)
    mark("started")
    watch(q, spec.get("timeout", 1800))
    print("done", flush=True)
    mark("done")


def watch(q, timeout: float) -> None:
    """Wait for the query, printing one ``[progress]`` line per micro-batch (the soak reads the lag off them)."""
    deadline, seen, total = time.monotonic() + timeout, -1, 0
    while time.monotonic() < deadline:
        finished = q.awaitTermination(1)
        for p in q.recentProgress:
            if p["batchId"] > seen:
                seen = p["batchId"]
                total += int(p.get("numInputRows") or 0)
                print(f"[progress] {json.dumps({'batch': seen, 'rows': total, 't': time.time()})}", flush=True)
        if finished:
            return


def phases(spark, spec: dict) -> None:
    """Fault 3: a batch read, a streaming read and a streaming write, one after the other, each announced
    on stdout so the test knows what its worker kills hit."""
    opts, root = spec["options"], spec["root"]
    for name in ("batch", "stream-read", "stream-write"):
        print(f"phase {name} start", flush=True)
        if name == "batch":
            spark.read.format("msgstream").options(**opts).load().write.parquet(f"{root}/batch")
        else:
            df = (spark.readStream.format("msgstream").options(**opts).option("subscription", name)
                  .option("maxRowsPerTrigger", str(spec.get("max_rows", 2000))).load())
            if name == "stream-read":
                w = df.writeStream.format("parquet").option("path", f"{root}/stream")
            else:
                w = df.writeStream.format("msgstream").options(**spec["sink_options"])
            q = w.option("checkpointLocation", f"{root}/chk-{name}").trigger(availableNow=True).start()
            q.awaitTermination(spec.get("timeout", 1200))
        print(f"phase {name} done", flush=True)


if __name__ == "__main__":
    main()
