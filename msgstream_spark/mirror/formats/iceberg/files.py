"""The files of an Iceberg mirror table, through the table's store: the manifest entries (``DataFile``) of data
files tasks wrote, position-delete files written and read, and the two spellings of a file's location.

A manifest and a position-delete file name every file by a full URI (``s3://bucket/t/data/x.parquet``,
``file:///abs/t/data/x.parquet``); the mirror's own lists (live files, vacuum's candidates) use the store's
spelling (``Store.join``: a URI, or a plain absolute path on a local table given as a path). A table of an
earlier release names its local files by scheme-less absolute paths: a position delete must name a data file
exactly as its manifest does, so the manifest's spelling of each live file is kept (``LiveFiles``' paths map).

A position-delete file is a Parquet file of ``file_path`` (field id 2147483546) and ``pos`` (2147483545) sorted by
both (Iceberg spec, "Position Delete Files"); its row count, size and the bounds of the paths it names are known
when it is written, so nothing is read back. A data file's entry takes its statistics from the file's footer,
read by range through the store, and its size from the store.
"""

from __future__ import annotations

import threading
import uuid
from collections import OrderedDict

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from msgstream_spark.mirror.formats.iceberg.catalog import manifest_uri
from msgstream_spark.mirror.store import Store, uri
from msgstream_spark.mirror.store.parquet import footer as parquet_footer

FILE_PATH_ID = 2147483546
POS_ID = 2147483545
DELETE_SCHEMA = pa.schema([
    pa.field("file_path", pa.string(), False, metadata={b"PARQUET:field_id": str(FILE_PATH_ID).encode()}),
    pa.field("pos", pa.int64(), False, metadata={b"PARQUET:field_id": str(POS_ID).encode()}),
])


def store_path(store: Store, path: str) -> str:
    """A manifest's file location in the store's spelling (a local table given as a path: a plain path)."""
    loc = uri.parse(path)
    if loc.kind != "local":
        return str(path)
    return "file://" + loc.key if str(store.root).startswith("file:") else loc.key


def write_position_deletes(store: Store, data_dir: str, deletes: dict[str, np.ndarray], spec_id: int, partition):
    """One position-delete file under ``data_dir`` holding ``deletes`` (data file URI as its manifest names it ->
    positions), sorted by path and position, written through the store; its manifest entry."""
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat

    paths, pos = [], []
    for p in sorted(deletes):
        v = np.sort(np.asarray(deletes[p], dtype=np.int64))
        paths += [p] * len(v)
        pos.append(v)
    table = pa.Table.from_arrays([pa.array(paths, pa.string()), pa.array(np.concatenate(pos))], schema=DELETE_SCHEMA)
    target = uri.join(data_dir, f"delete-{uuid.uuid4().hex}.parquet")
    with store.open_output(target) as out:
        pq.write_table(table, out, compression="zstd", row_group_size=128 * 1024)
        size = out.tell()
    return DataFile.from_args(
        content=DataFileContent.POSITION_DELETES, file_path=manifest_uri(target), file_format=FileFormat.PARQUET,
        partition=partition, record_count=table.num_rows, file_size_in_bytes=size, spec_id=spec_id,
        lower_bounds={FILE_PATH_ID: paths[0].encode()}, upper_bounds={FILE_PATH_ID: paths[-1].encode()},
        column_sizes={}, value_counts={}, null_value_counts={}, nan_value_counts={}, split_offsets=None,
        sort_order_id=None, equality_ids=None, key_metadata=None)


def read_position_deletes(store: Store, path: str) -> dict[str, np.ndarray]:
    """Data file URI (as the manifests name it) -> positions, of one position-delete file (read whole)."""
    t = pq.ParquetFile(pa.BufferReader(store.read(store_path(store, path)))).read()  # no dataset layer: ~0.4 ms less
    out = {}
    for p in pc.unique(t.column("file_path")).to_pylist():
        out[p] = t.filter(pc.equal(t.column("file_path"), p)).column("pos").to_numpy()
    return out


METRICS_PROPERTIES = "write.metadata.metrics."  # the table properties a statistics plan reads (its modes)
PLANS_KEPT = 64  # table schemas whose statistics plan, column mapping and checked file schemas are kept
# (a schema's content, its metrics modes, the format version) -> (plan, mapping, the file schemas found compatible)
_PLANS: OrderedDict[tuple, tuple] = OrderedDict()
_PLANS_LOCK = threading.Lock()


def _plan_key(metadata, schema) -> tuple:
    """What a statistics plan, a column mapping and a file schema's check depend on: the schema by its content (two
    tables of one collection schema share them: the first batch of a restarted database job reads 20 tables'
    schemas, each its own object; by its JSON, ~15 us: a list type's hash is its object's), the table's metrics
    modes and its format version."""
    metrics = frozenset((k, v) for k, v in metadata.properties.items() if k.startswith(METRICS_PROPERTIES))
    return schema.model_dump_json(), metrics, metadata.format_version


def data_file(store: Store, metadata, path: str, size: int = 0):
    """The manifest entry of a Parquet data file at ``path`` (a task's, a compaction's, a snapshot's): its
    statistics from the footer (kept by this process's writer or shipped by the task that wrote it, else read by
    range through the store) and its size (``size``: as its writer reported it; else asked of the store), the
    table's field
    ids matched by id or (files written without them) by the table's name mapping. The table schema's
    statistics plan and column mapping are built once per schema content (and metrics modes), and a file schema
    is checked against it once (the next file of the same Arrow schema, metadata included, is not checked again:
    pyiceberg built and checked them all at each file, ~0.7 ms of CPU a file)."""
    from pyiceberg.io.pyarrow import (
        _check_pyarrow_schema_compatible,
        compute_statistics_plan,
        data_file_statistics_from_parquet_metadata,
        parquet_path_to_id_mapping,
    )
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat

    size, footer = parquet_footer(store, path, size)
    schema = metadata.schema()
    key = _plan_key(metadata, schema)
    known = _PLANS.get(key)
    if known is None:
        known = (compute_statistics_plan(schema, metadata.properties), parquet_path_to_id_mapping(schema), [])
        with _PLANS_LOCK:
            _PLANS[key] = known
            while len(_PLANS) > PLANS_KEPT:
                _PLANS.popitem(last=False)
    arrow = footer.schema.to_arrow_schema()
    if not any(arrow.equals(ok, check_metadata=True) for ok in known[2]):
        _check_pyarrow_schema_compatible(schema, arrow, format_version=metadata.format_version)
        known[2][:] = [*known[2][-3:], arrow]  # a compatible file schema: the same one is not checked again
    stats = data_file_statistics_from_parquet_metadata(parquet_metadata=footer, stats_columns=known[0],
                                                       parquet_column_mapping=known[1])
    return DataFile.from_args(
        content=DataFileContent.DATA, file_path=manifest_uri(path), file_format=FileFormat.PARQUET,
        partition=stats.partition(metadata.spec(), schema), file_size_in_bytes=size, sort_order_id=None,
        spec_id=metadata.default_spec_id, equality_ids=None, key_metadata=None, **stats.to_serialized_dict())


def file_schema(store: Store, path: str) -> pa.Schema:
    """The Arrow schema of a Parquet file (its footer, read by range through the store)."""
    with store.open_input(path) as f:
        return pq.read_schema(f)
