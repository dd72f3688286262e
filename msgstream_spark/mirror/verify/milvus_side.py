"""Verify's view of the collection: every row, or named keys, as record batches of the table's schema.

The narrow interface :class:`MilvusSide` is all :mod:`msgstream_spark.mirror.verify.compare` needs, so the reader
behind it can change (today the snapshot's own ``Query`` calls per primary-key range, decoded column-wise
by :class:`~msgstream_spark.mirror.snapshot.query.reader.RangeReader`:
"at least S", every call carrying S as its ``guarantee_timestamp`` with consistency Customized as the
snapshot's do, Strong when there is no S; verify does not pin its reads).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Protocol

import pyarrow as pa

from msgstream_spark.mirror.snapshot.handover import (
    CollectionInfo,
    MilvusTarget,
    collection_partitions,
    describe,
    query_target,
)
from msgstream_spark.mirror.snapshot.query.answer import answer_batch
from msgstream_spark.mirror.snapshot.query.ranges import string_literal
from msgstream_spark.mirror.snapshot.query.reader import RangeReader, plan_ranges, row_bytes
from msgstream_spark.mirror.snapshot.query.rpc import Querier, QueryTarget

META = "$meta"  # Milvus's dynamic field
KEYS_PER_QUERY = 1000


class MilvusSide(Protocol):
    """The collection's rows as batches of the table's schema (``_ts`` = the read's S, ``_seq`` its order)."""

    pk: str
    by_partition: bool  # rows carry their partition's id in ``_partition`` (False: a partition-key collection)
    json_columns: tuple[str, ...]

    def scan(self, schema: pa.Schema, s: int) -> Iterator[pa.RecordBatch]:
        """Every row of the collection, read at least at Milvus time ``s``."""

    def rows_of(self, keys: list, schema: pa.Schema, s: int) -> pa.Table:
        """The rows of ``keys`` (keys Milvus does not have are absent), read at least at ``s``."""


class SdkMilvusSide:
    """:class:`MilvusSide` through the snapshot's queries: at least at S (Customized, S as the guarantee timestamp;
    Strong for S = 0), by primary-key range (and per partition)."""

    def __init__(self, config, target: MilvusTarget) -> None:
        from pymilvus import DataType  # lazily: importing the SDK costs every command ~0.5 s

        self.target = target
        mc = target.client()
        try:
            self.info: CollectionInfo = describe(target, mc)
            desc = mc.describe_collection(target.collection)
        finally:
            mc.close()
        self.pk = self.info.pk
        self.json_columns = tuple([f["name"] for f in desc["fields"] if f.get("type") == DataType.JSON]
                                  + ([META] if self.info.dynamic else []))
        self.partitions = collection_partitions(config, self.info, target.collection)
        self.by_partition = self.partitions is not None
        self.query = query_target(config, self.info, target.collection)

    def _at(self, s: int) -> QueryTarget:
        """The queries' target reading at S or later (``floor_ts``; 0: Strong)."""
        return replace(self.query, floor_ts=max(0, s))

    def scan(self, schema: pa.Schema, s: int) -> Iterator[pa.RecordBatch]:
        target = self._at(s)
        q = Querier(target)
        try:
            ranges = plan_ranges(q, self.pk, self.info.pk_is_string, 1, self.partitions)
            width = row_bytes(q, self.pk, self.info.pk_is_string, ranges[0]) if ranges else 0
        finally:
            q.close()
        yield from RangeReader(target, self.pk, self.info.pk_is_string, schema, s, row_bytes=width or 1024,
                               in_flight=1).read(ranges)

    def rows_of(self, keys: list, schema: pa.Schema, s: int) -> pa.Table:
        lit = string_literal if self.info.pk_is_string else (lambda k: str(int(k)))
        q = Querier(self._at(s))
        batches = []
        try:
            parts = self.partitions or [(None, None)]
            for i in range(0, len(keys), KEYS_PER_QUERY):
                expr = f"{self.pk} in [{', '.join(lit(k) for k in keys[i:i + KEYS_PER_QUERY])}]"
                for name, pid in parts:
                    resp = q.call(q.request(expr, ["*"], [name] if name else None), f"the rows of {len(keys)} key(s)")
                    if any(len(fd.scalars.long_data.data) or len(fd.scalars.string_data.data)
                           for fd in resp.fields_data if fd.field_name == self.pk):
                        batches.append(answer_batch(resp.fields_data, schema, self.pk, s, pid))
        finally:
            q.close()
        return pa.Table.from_batches(batches, schema=schema)
