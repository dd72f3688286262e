"""A spark-submit app that reports where executors find msgstream_spark, with and without the shipped env.

Run by tests/cluster/test_cluster_jobs.py: one task runs the app's Python (``spark.pyspark.python``,
the shipped ``./environment``), then one runs the worker's bare interpreter (``argv[1]``); each
reports its interpreter, its working directory and ``import msgstream_spark``'s outcome as JSON.
"""

import json
import sys

from pyspark.sql import SparkSession


def where(_):
    import os
    import sys

    try:
        import msgstream_spark.spark.datasource as ds

        found = ds.__file__
    except ImportError as exc:
        found = f"ImportError: {exc}"
    yield {"python": sys.executable, "realpath": os.path.realpath(sys.executable), "cwd": os.getcwd(),
           "msgstream_spark": found}


def main() -> None:
    spark = SparkSession.builder.appName("msgstream-cluster-probe").getOrCreate()
    sc = spark.sparkContext
    shipped = sc.parallelize([0], 1).mapPartitions(where).collect()[0]
    sc.pythonExec = sys.argv[1]  # the worker's own interpreter for the next task
    bare = sc.parallelize([0], 1).mapPartitions(where).collect()[0]
    print("PROBE " + json.dumps({"shipped": shipped, "bare": bare}))
    spark.stop()


if __name__ == "__main__":
    main()
