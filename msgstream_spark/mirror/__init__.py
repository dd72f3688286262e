"""Spark-free table keeping: the change order per primary key (``_seq``), the collapse of a batch per key,
and exactly-once merges into Delta (delta-rs) or Iceberg (pyiceberg) tables. See docs/mirror.md."""

from msgstream_spark.mirror.apply import apply_batch
from msgstream_spark.mirror.collapse import collapse
from msgstream_spark.mirror.order import SEQ, SEQ_TYPE, seq_array, seq_value, snapshot_seq, snapshot_seq_array
from msgstream_spark.mirror.table import MirrorTable, open_table, table_schema

__all__ = ["SEQ", "SEQ_TYPE", "MirrorTable", "apply_batch", "collapse", "open_table", "seq_array", "seq_value",
           "snapshot_seq", "snapshot_seq_array", "table_schema"]
