"""A batch write (wireFormat=2.6, transactional) whose first task attempt is killed after producing.

Run as its own process (master ``local[1,3]``: Spark retries a failed task) with PYTHONPATH holding
tests/sink/site plus the repository and MSGSTREAM_TEST_KILL_AFTER_PRODUCE set to a marker path, so
the first Python worker dies after its rows are acknowledged and before its CommitTxn.
argv: config file, channels, rows.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def main() -> int:
    cfg, channels, rows = sys.argv[1], sys.argv[2], int(sys.argv[3])
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[1,3]").config("spark.ui.enabled", "false").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    df = spark.range(0, rows, numPartitions=1).selectExpr("id as pk", "cast(id as double) / 2 as v")
    (df.write.format("msgstream").option("config", cfg).option("channels", channels).option("wireFormat", "2.6")
     .option("transactional", "true").option("txnKeepalive", "1").mode("append").save())
    spark.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
