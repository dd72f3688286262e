"""Publish: a Parquet / CSV / JSON Lines file, or a synthetic collection, as insert events.

``msgstream spark-publish --channels ch0,ch1 --synthetic 100000 --dim 128`` writes rows with
``df.write.format("msgstream")`` (sharded by Milvus's hash of the primary key), optionally
followed by deletes of a fraction of the published keys.
"""

from __future__ import annotations

import argparse
import time
from typing import Any

import pyarrow as pa

from msgstream_spark.cli.publish_args import add_publish_args, wire_options
from msgstream_spark.cli.vocab import add_channels_arg, add_flag
from msgstream_spark.jobs._common import add_config_args, main_wrapper, source_options, spark_session


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="publish", description=__doc__.split("\n\n")[0])
    add_config_args(p)
    add_channels_arg(p, meaning="comma-separated target channels (pchannels), shard i -> i")
    add_publish_args(p)
    add_flag(p, ("--num-tasks",), old=("--partitions",), dest="partitions", type=int, default=None, metavar="N",
             help="Spark write tasks (the DataFrame's partitions; default: Spark's parallelism)")
    p.add_argument("--writer-id", help="stable writer id (exactly-once across reruns)")
    return p


def synthetic_df(spark, rows: int, dim: int, start: int = 0, partitions: int | None = None):
    """The synthetic collection as a DataFrame, generated column-wise in ``mapInArrow``."""
    from pyspark.sql.types import ArrayType, FloatType, LongType, StringType, StructField, StructType

    schema = StructType([StructField("pk", LongType(), False), StructField("category", StringType()),
                         StructField("score", FloatType()), StructField("vec", ArrayType(FloatType()))])

    def gen(batches):
        from msgstream_spark.cli.data import synthetic_batch

        for b in batches:
            ids = b.column(0).to_numpy()
            if len(ids) == 0:
                continue
            out = synthetic_batch(int(ids[0]), len(ids), dim)
            if int(ids[-1]) - int(ids[0]) + 1 != len(ids):  # not contiguous: take the rows we need
                out = out.take(pa.array(ids - ids.min()))
            yield out

    n_parts = partitions or spark.sparkContext.defaultParallelism
    return spark.range(start, start + rows, numPartitions=n_parts).mapInArrow(gen, schema)


def read_input(spark, path: str, fmt: str | None):
    from msgstream_spark.cli.data import detect_format

    f = detect_format(path, fmt) if fmt or "." in path.rsplit("/", 1)[-1] else "parquet"
    reader = spark.read.format(f)
    if f == "csv":
        reader = reader.option("header", "true").option("inferSchema", "true")
    return reader.load(path)


def run(args: argparse.Namespace, spark=None) -> dict[str, Any]:
    from pyspark.sql import functions as F

    if not 0.0 <= args.delete_fraction <= 1.0:
        raise argparse.ArgumentTypeError("--delete-fraction must be between 0 and 1")
    spark = spark or spark_session("msgstream-publish", args.master)
    if args.synthetic is not None:
        if args.synthetic < 0 or args.dim <= 0:
            raise argparse.ArgumentTypeError("--synthetic needs ROWS >= 0 and --dim > 0")
        df = synthetic_df(spark, args.synthetic, args.dim, args.start, args.partitions)
        pk = "pk"
    else:
        df = read_input(spark, args.input, args.format)
        if args.partitions:
            df = df.repartition(args.partitions)
        pk = args.primary_key or next((c for c in ("pk", "id") if c in df.columns), None)
    opts = source_options(args, channels=args.channels, collection=args.collection,
                          collectionID=args.collection_id, partition=args.partition, primaryKey=args.primary_key,
                          fieldTypes=args.field_types, maxMessageSize=args.max_message_size,
                          writerId=args.writer_id)
    opts.update(wire_options(args))
    t0 = time.perf_counter()
    df.write.format("msgstream").options(**opts).mode("append").save()
    secs = time.perf_counter() - t0
    inserted = args.synthetic if args.synthetic is not None else df.count()
    deleted = 0
    if args.delete_fraction > 0 and pk is not None:
        step = max(1, int(round(1.0 / args.delete_fraction)))
        if args.synthetic is not None:
            dels = spark.range(args.start, args.start + args.synthetic, step).select(
                F.lit("delete").alias("op"), F.col("id").alias("pk"))
        else:
            dels = (df.select(pk).withColumn("_i", F.monotonically_increasing_id())
                    .where(F.col("_i") % step == 0).select(F.lit("delete").alias("op"), F.col(pk)))
        deleted = dels.count()
        if args.writer_id:  # a second write needs its own writer id, or its ids repeat the first's
            opts["writerId"] = f"{args.writer_id}-deletes"
        dels.write.format("msgstream").options(**opts).mode("append").save()
    total = time.perf_counter() - t0
    return {"job": "publish", "channels": args.channels, "inserted": int(inserted), "deleted": int(deleted),
            "insert_seconds": round(secs, 3), "seconds": round(total, 3),
            "insert_rows_per_second": round(inserted / secs, 1) if secs > 0 else None}


def main(argv=None, prog: str | None = None) -> int:
    return main_wrapper(build_parser(), run, argv, prog)


if __name__ == "__main__":
    raise SystemExit(main())
