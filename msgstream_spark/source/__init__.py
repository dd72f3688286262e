"""The Spark-free read core: plan a read over channels, read each range into Arrow record batches.

``read_arrow`` is the library's read without Spark (the rows of ``spark.read.format("msgstream")``);
``msgstream_spark.spark`` adapts the same core to Spark's data source API.
"""

from msgstream_spark.source.arrow import read_arrow, read_table

__all__ = ["read_arrow", "read_table"]
