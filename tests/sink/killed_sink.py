"""A streaming write run as its own process whose Python workers carry the kill failpoint.

argv: config file, channels, source dir, checkpoint dir, then optional sink options KEY=VALUE. The
caller sets PYTHONPATH to tests/sink/site plus the repository, and MSGSTREAM_TEST_KILL_AFTER_PRODUCE
to a marker path.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def main() -> int:
    cfg, channels, src, chk = sys.argv[1:5]
    extra = dict(a.split("=", 1) for a in sys.argv[5:])
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    q = (spark.readStream.schema("pk long, v double").parquet(src).writeStream.format("msgstream")
         .option("config", cfg).option("channels", channels).option("writerId", "eo-test")
         .options(**extra).option("checkpointLocation", chk).trigger(availableNow=True).start())
    try:
        q.awaitTermination(300)
    except Exception as exc:  # noqa: BLE001 - the killed worker fails the query: report it
        print(f"query failed: {exc}".splitlines()[0], flush=True)
        return 3
    return 0 if q.exception() is None else 3


if __name__ == "__main__":
    sys.exit(main())
