"""A snapshot task's Parquet file, written with pyarrow (no row through the JVM), whole or not at all.

Spark-free. Both routes' tasks (the query route's ranges, the storage route's units) write their rows as
one file each: under a temporary name, synced, then renamed, so a retried task replaces its file whole and
a failed one leaves none. Strings and binaries are dictionary-encoded, nothing else (a vector's floats
would only pay for a dictionary that never fills); snappy, except lists of floating-point values (float
vectors): embeddings do not compress (snappy saved 2% on 128-d vectors) and writing them without it, and
without page statistics (an element's min and max prune nothing), took a third less time.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable, Iterable

import pyarrow as pa
import pyarrow.parquet as pq

from msgstream_spark.mirror.formats.delta.log import fsync_path

ROW_GROUP = 128 * 1024


def write_batches(schema: pa.Schema, batches: Iterable[pa.RecordBatch], path: str,
                  on_rows: Callable[[int], None] | None = None) -> int:
    """``batches`` (of ``schema``) as one Parquet file at the local ``path``; the rows written (the file is
    written even when there are none). ``on_rows`` is told each batch's rows as it is written (progress)."""
    writer, tmp, rows = None, f"{path}.{uuid.uuid4().hex[:8]}.tmp", 0
    dictionary = [f.name for f in schema if pa.types.is_string(f.type) or pa.types.is_binary(f.type)]
    floats = {f.name for f in schema if _float_list(f.type)}
    try:
        writer = pq.ParquetWriter(tmp, schema, use_dictionary=dictionary,
                                  compression={f.name: "none" if f.name in floats else "snappy" for f in schema},
                                  write_statistics=[f.name for f in schema if f.name not in floats])
        for batch in batches:
            if batch.num_rows:
                writer.write_batch(batch, row_group_size=ROW_GROUP)
                rows += batch.num_rows
                if on_rows is not None:
                    on_rows(batch.num_rows)
        writer.close()
        writer = None
        fsync_path(tmp)
        os.replace(tmp, path)
    finally:
        if writer is not None:
            writer.close()
        if os.path.exists(tmp):
            os.remove(tmp)
    return rows


def _float_list(t: pa.DataType) -> bool:
    return (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)) and \
        pa.types.is_floating(t.value_type)
