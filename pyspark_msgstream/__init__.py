"""Auto-registration of the ``msgstream`` data source: Spark 4 registers every installed
top-level ``pyspark_*`` module's ``DefaultSource``."""

from msgstream_spark.spark.datasource import MsgStreamDataSource as DefaultSource

__all__ = ["DefaultSource"]
