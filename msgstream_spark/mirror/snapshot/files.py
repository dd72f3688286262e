"""A snapshot task's Parquet file, written with pyarrow (no row through the JVM), whole or not at all.

Spark-free. Both routes' tasks (the query route's ranges, the storage route's units) write their rows as
one file each: under a temporary name, synced, then renamed, so a retried task replaces its file whole and
a failed one leaves none. Strings and binaries are dictionary-encoded, nothing else (a vector's floats
would only pay for a dictionary that never fills); snappy, as the storage route has written since #30.
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
    try:
        writer = pq.ParquetWriter(tmp, schema, compression="snappy", use_dictionary=dictionary)
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
