"""A streaming query run as its own process so a test can SIGKILL the driver mid-stream."""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("PYSPARK_PYTHON", sys.executable)


def main() -> None:
    opts, channels, chk, out = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[2]").config("spark.ui.enabled", "false")
             .config("spark.sql.shuffle.partitions", "2").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    q = (spark.readStream.format("msgstream").options(**opts).option("channels", channels)
         .option("subscription", "killed").option("maxRowsPerTrigger", "10").load()
         .writeStream.format("parquet").option("path", out).option("checkpointLocation", chk)
         .trigger(processingTime="200 milliseconds").start())
    print("started", flush=True)
    q.awaitTermination(600)


if __name__ == "__main__":
    main()
