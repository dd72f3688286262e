"""Spark 4.3's own AutoCDC code (spark-pipelines, the engine of ``create_auto_cdc_flow``) on a DataFrame:
its micro-batch validation and its SCD1 de-duplication by keys and ``sequence_by``, through py4j.

These are internal classes of Spark's pipelines module (``org.apache.spark.sql.pipelines.autocdc``): no
MERGE-capable table format is needed to run them, which this repository cannot fetch the jars of.
"""

from __future__ import annotations


def _autocdc(jvm):
    return jvm.org.apache.spark.sql.pipelines.autocdc


def change_args(spark, keys: list[str], sequence_by: str, delete_condition: str):
    from pyspark.sql import functions as F

    jvm = spark._jvm
    pkg = _autocdc(jvm)
    names = jvm.java.util.ArrayList()
    for k in keys:
        names.add(pkg.UnqualifiedColumnName.apply(k))
    seq = jvm.scala.jdk.javaapi.CollectionConverters.asScala(names).toList()
    type1 = getattr(getattr(pkg, "ScdType$Type1$"), "MODULE$")
    some = jvm.scala.Option.apply
    none = jvm.scala.Option.apply(None)
    return pkg.ChangeArgs.apply(seq, F.col(sequence_by)._jc, type1, some(F.expr(delete_condition)._jc), none, none)


def validate(spark, df, args, batch_id: int = 0) -> None:
    """ScdBatchValidator.validateMicrobatch: keys not null, sequence orderable and not null."""
    pkg = _autocdc(spark._jvm)
    ident = spark._jvm.org.apache.spark.sql.catalyst.TableIdentifier.apply("mirror_target")
    pkg.ScdBatchValidator.apply(ident, args, df._jdf, batch_id).validateMicrobatch()


def deduplicate(spark, df, args):
    """Scd1BatchProcessor.deduplicateMicrobatch: one row per key, the one with the largest sequence."""
    from pyspark.sql import DataFrame

    pkg = _autocdc(spark._jvm)
    seq_type = df._jdf.schema().apply(args.sequencing().toString().strip("`'")).dataType()
    out = pkg.Scd1BatchProcessor.apply(args, seq_type).deduplicateMicrobatch(df._jdf)
    return DataFrame(out, spark)
