"""A ``Query`` answer (``QueryResults.fields_data``) as one record batch of the table's columns.

Spark-free. The answer carries the same ``schema.FieldData`` as an insert, decoded column by column by
msg/columns.py (vectors as one buffer, JSON as the bytes Milvus stores, ``$meta`` included), with the
client forms a query answer uses turned back into the log's forms, so a snapshot row and a stream row
of the same value are the same bytes:

* Timestamptz comes as ISO-8601 strings in ``string_data`` (the proxy's ``timestamptzUTC2IsoStr``, in
  the collection's time zone): parsed to microseconds since the epoch, UTC (the log's int64);
* Geometry comes as WKT in ``geometry_wkt_data`` (``validateGeometryFieldSearchResult``): written back
  to ISO WKB (msg/wkt.py), the log's form;
* a struct array comes as one ``ArrayOfStruct`` FieldData holding its sub-fields
  (``reconstructStructFieldDataForQuery``): rebuilt into ``list<struct>`` as the stream rebuilds the
  log's flattened ``struct[sub]`` columns.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np
import pyarrow as pa

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.common import PARTITION, TS
from msgstream_spark.mirror.order import SEQ, snapshot_seq_array
from msgstream_spark.msg import columns as C
from msgstream_spark.msg.structs import rebuild_structs, stored_sub_name, struct_targets
from msgstream_spark.msg.wkt import to_wkb


def _timestamptz(fd: Any) -> pa.Array:
    strings = pa.array(list(fd.scalars.string_data.data), pa.string())
    valid = np.array(fd.valid_data, dtype=bool) if len(fd.valid_data) else None
    if valid is not None and valid.size == len(strings):
        strings = pa.array(strings.to_pylist(), pa.string(), mask=~valid)
    try:
        return strings.cast(C.TIMESTAMP_US_UTC)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise MirrorError(f"field {fd.field_name!r}: a Timestamptz value of the query answer is not an ISO-8601 "
                          f"time: {exc}") from exc


def _geometry(fd: Any) -> pa.Array:
    valid = list(fd.valid_data) or None
    wkt = list(fd.scalars.geometry_wkt_data.data)
    if valid is not None and len(valid) == len(wkt):
        return pa.array([to_wkb(w) if ok else None for w, ok in zip(wkt, valid)], pa.binary())
    out = pa.array([to_wkb(w) for w in wkt], pa.binary())
    return out if valid is None else C._apply_valid(out, np.array(valid, bool), fd.field_name)


def field_columns(fields_data: Iterable[Any]) -> dict[str, pa.Array]:
    """Each answer column by name (a struct array's sub-fields as ``struct[sub]``)."""
    out: dict[str, pa.Array] = {}
    for fd in fields_data:
        t = int(fd.type)
        if t == C.ARRAY_OF_STRUCT:
            for sub in fd.struct_arrays.fields:
                out[stored_sub_name(fd.field_name, sub.field_name)] = C.field_data_to_arrow(sub)
        elif t == C.TIMESTAMPTZ and fd.scalars.WhichOneof("data") == "string_data":
            out[fd.field_name] = _timestamptz(fd)
        elif t == C.GEOMETRY and fd.scalars.WhichOneof("data") == "geometry_wkt_data":
            out[fd.field_name] = _geometry(fd)
        else:
            out[fd.field_name] = C.field_data_to_arrow(fd)
    return out


def answer_batch(fields_data: Iterable[Any], schema: pa.Schema, pk: str, snapshot_ts: int,
                 partition_id: int | None) -> pa.RecordBatch:
    """The rows of one answer as a batch of ``schema`` (the table's columns): each row a change at S
    (``_ts`` = S, ``_seq`` after every change at S), ``_partition`` the partition read (null: all)."""
    values = field_columns(fields_data)
    if pk not in values:
        raise MirrorError(f"the query answer has no primary key column {pk!r} (columns: {sorted(values)})")
    rebuild_structs(values, struct_targets(schema))
    n = len(values[pk])
    values[TS] = pa.array(np.full(n, snapshot_ts, dtype=np.int64))
    values[SEQ] = snapshot_seq_array(snapshot_ts, n)
    values[PARTITION] = pa.array(np.full(n, partition_id or 0, dtype=np.int64),
                                 mask=None if partition_id is not None else np.ones(n, dtype=bool))
    cols = []
    for f in schema:
        col = values.get(f.name)
        if col is None:
            cols.append(pa.nulls(n, f.type))
            continue
        if len(col) != n:
            raise MirrorError(f"the query answer's column {f.name!r} has {len(col)} rows, the key {n}")
        cols.append(col if col.type == f.type else col.cast(f.type))
    return pa.RecordBatch.from_arrays(cols, schema=schema)
