"""The Spark data source ``msgstream``: batch and streaming reads and writes.

    spark.readStream.format("msgstream").option("channels", "...").option("subscription", "s").load()
    spark.read.format("msgstream").option("channels", "...").option("startingPositions", pos).load()
    df.write.format("msgstream").option("channels", "...").option("collection", "c").save()

Registered automatically through the top-level module ``pyspark_msgstream`` (Spark looks up
installed ``pyspark_*`` modules) and with ``spark.dataSource.register(MsgStreamDataSource)``.
Options are validated on the driver: docs/spark-source.md lists them.
"""

from __future__ import annotations

import json
from typing import Any

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition
from pyspark.sql.types import StructType

from msgstream_spark.source.offsets import resolve_end, resolve_start
from msgstream_spark.source.options import ReadOptions, parse_read_options
from msgstream_spark.source.read import collection_filter, list_channels
from msgstream_spark.source.rows import rows_schema_ddl
from msgstream_spark.source.schema import user_pk
from msgstream_spark.spark.partitions import plan_partitions, read_partition
from msgstream_spark.spark.stream_reader import MsgStreamStreamReader
from msgstream_spark.spark.structs import infer
from msgstream_spark.spark.writer import batch_writer, stream_writer

PK_META = "msgstream.primaryKey"
COLLECTION_META = "msgstream.collectionId"


def _annotate(parsed: StructType, pk: str | None, cid: int | None) -> StructType:
    """The schema with the primary key and the inferred collection id as field metadata."""
    from pyspark.sql.types import StructField

    fields = []
    for f in parsed.fields:
        meta = dict(f.metadata or {})
        if pk and f.name == pk:
            meta[PK_META] = True
        if f.name == "op" and cid is not None:
            meta[COLLECTION_META] = cid
        fields.append(StructField(f.name, f.dataType, True, meta))
    return StructType(fields)


def _facts(schema: StructType, opts: ReadOptions) -> tuple[str, str | None, tuple[int | None, str | None]]:
    """(schema JSON, pk name, collection filter) for partitions."""
    pk = next((f.name for f in schema.fields if (f.metadata or {}).get(PK_META)), None) or user_pk(schema)
    return json.dumps(schema.jsonValue()), pk, collection_filter(opts)


class MsgStreamDataSource(DataSource):
    """Milvus message streams (Kafka, Pulsar or the embedded log) as a Spark data source."""

    @classmethod
    def name(cls) -> str:
        return "msgstream"

    def _opts(self, streaming: bool | None) -> ReadOptions:
        return parse_read_options(self.options, streaming=streaming)

    def schema(self) -> StructType | str:
        opts = self._opts(None)
        client = opts.client()
        try:
            channels = list_channels(opts, client)
        finally:
            client.close()
        if opts.schema_ddl:
            return rows_schema_ddl(opts.schema_ddl) if opts.output == "rows" else opts.schema_ddl
        struct, pk, cid = infer(opts, channels)
        return _annotate(struct, pk, cid)

    def reader(self, schema: StructType) -> DataSourceReader:
        return MsgStreamBatchReader(self._opts(False), schema)

    def streamReader(self, schema: StructType):  # noqa: N802 - Spark's name

        opts = self._opts(True)
        schema_json, pk, coll = _facts(schema, opts)
        return MsgStreamStreamReader(opts, schema_json, pk, coll)

    def writer(self, schema: StructType, overwrite: bool) -> Any:
        return batch_writer(self.options, schema, overwrite)

    def streamWriter(self, schema: StructType, overwrite: bool) -> Any:  # noqa: N802

        return stream_writer(self.options, schema, overwrite)


class MsgStreamBatchReader(DataSourceReader):
    """A bounded read: startingPositions/startingTimestamp to endingPositions/endingTimestamp."""

    def __init__(self, opts: ReadOptions, schema: StructType) -> None:
        self.opts = opts
        self.schema_json, self.pk, self.collection = _facts(schema, opts)

    def partitions(self) -> list[InputPartition]:
        client = self.opts.client()
        try:
            channels = list_channels(self.opts, client)
            start = resolve_start(client, channels, self.opts.starting, self.opts.starting_ts,
                                  self.opts.fail_on_data_loss, self.opts.subscription)
            end = resolve_end(client, channels, self.opts.ending, self.opts.ending_ts)
            return plan_partitions(client, start, end, self.opts, self.schema_json, self.pk, self.collection)
        finally:
            client.close()

    def read(self, partition: InputPartition):
        return read_partition(partition)  # type: ignore[arg-type]
