"""A user's program: write and read back through format("msgstream") with no register() call.

Run by tests/packaging as a separate process, from a directory outside the repo, with the interpreter of the
install under test (the project's editable venv or a fresh venv holding the built wheel). Prints one JSON line.
"""

from __future__ import annotations

import json
import os
import sys


def main(log_path: str, channel: str) -> None:
    from pyspark.sql import SparkSession

    spark = (SparkSession.builder.master("local[1]").appName("msgstream-roundtrip")
             .config("spark.ui.enabled", "false").config("spark.driver.memory", "1g").getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    opts = {"mq.type": "local", "local.path": log_path, "channels": channel}
    rows = [(i, [float(i), float(i) + 0.5], f"n{i}") for i in range(5)]
    df = spark.createDataFrame(rows, "pk long, vec array<float>, name string")
    df.write.format("msgstream").options(**opts).option("collection", "roundtrip").mode("append").save()
    back = spark.read.format("msgstream").options(**opts).load()
    got = sorted([r.op, r.pk, r.vec, r.name] for r in back.collect())

    def where_workers_import(_):
        import os as wos

        import msgstream_spark as wm
        import pyspark_msgstream as wp

        return [wm.__file__, wp.__file__, wos.getcwd()]

    worker = spark.sparkContext.parallelize([0], 1).map(where_workers_import).collect()[0]
    import msgstream_spark
    import pyspark_msgstream

    print(json.dumps({"rows": got, "driver": [msgstream_spark.__file__, pyspark_msgstream.__file__, os.getcwd()],
                      "worker": worker, "sys_path": sys.path}))
    spark.stop()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])
