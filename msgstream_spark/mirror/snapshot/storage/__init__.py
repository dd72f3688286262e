"""A collection's snapshot from Milvus's own storage (storage v1 binlogs, 2.3-2.5): segment metadata and channel
checkpoints from etcd at one revision, the binlogs' Parquet payloads through pyarrow file systems. Spark-free;
the Spark adapter is ``msgstream_spark.spark.storage_snapshot``. See docs/mirror.md, "Snapshot from storage"."""
