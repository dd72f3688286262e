"""Milvus's storage v1 binlog files (2.3-2.5): the container around each field's Parquet payload.

Layout (``internal/storage/binlog_writer.go``, ``event_header.go``, ``event_data.go``, ``binlog_reader.go``
of milvus-io/milvus; little-endian): a 4-byte magic ``0xfffabc``; a descriptor event; then insert or
delete events. Every event starts with a 17-byte header (timestamp u64, type code u8, event length i32,
next position i32, the offset of the next event from the file's start). The descriptor event's data is
``DescriptorEventDataFixPart`` (collection, partition, segment, field ids i64; start, end timestamps u64;
payload data type i32), then one post-header length byte per event type the writer knew, then an i32
length and that many bytes of extra JSON (``original_size``, ``nullable`` from 2.4). An insert or delete
event's data is its start and end timestamps (u64 each) and a Parquet file to the event's end: one
column; vectors as ``FixedSizeBinary`` (dim * 4 bytes for float), JSON as binary, an Array row as a
serialized ``schema.ScalarField``. A 2.3 delete log's payload holds one string per deleted row, the JSON
``{"pk":..,"ts":..,"pkType":..}`` (or ``pk,ts`` from older writers; ``storage/data_codec.go``,
``DeleteCodec.Deserialize``).
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from msgstream_spark.errors import DecodeError

MAGIC = 0xFFFABC
HEADER = struct.Struct("<QBii")  # timestamp, type code, event length, next position
DESCRIPTOR_FIX = struct.Struct("<qqqqQQi")  # collection, partition, segment, field, start ts, end ts, data type
EVENT_TS = struct.Struct("<QQ")
DESCRIPTOR_EVENT, INSERT_EVENT, DELETE_EVENT = 0, 1, 2


@dataclass(frozen=True)
class Descriptor:
    collection_id: int
    partition_id: int
    segment_id: int
    field_id: int
    start_ts: int
    end_ts: int
    data_type: int  # schema.DataType of the payload
    extras: dict = field(default_factory=dict)


@dataclass
class Binlog:
    descriptor: Descriptor
    payloads: list[pa.Table]  # one per insert/delete event, each one column

    def column(self) -> pa.ChunkedArray:
        """The payload rows of every event, in file order."""
        if not self.payloads:
            return pa.chunked_array([], pa.null())
        return pa.chunked_array([c for t in self.payloads for c in t.column(0).chunks], self.payloads[0].column(0).type)


def _descriptor(buf: memoryview, start: int, length: int, where: str) -> Descriptor:
    fix = DESCRIPTOR_FIX.unpack_from(buf, start + HEADER.size)
    end = start + length
    after = start + HEADER.size + DESCRIPTOR_FIX.size
    # the post-header lengths: one byte per event type of the writer's build; the extra's i32 length follows
    for n in range(0, 256):
        at = after + n
        if at + 4 > end:
            break
        (extra_len,) = struct.unpack_from("<i", buf, at)
        if extra_len >= 0 and at + 4 + extra_len == end:
            raw = bytes(buf[at + 4:end])
            try:
                extras = json.loads(raw) if raw else {}
            except ValueError as exc:
                raise DecodeError(f"binlog {where}: the descriptor's extra is not JSON: {exc}") from exc
            return Descriptor(*fix, extras=extras if isinstance(extras, dict) else {})
    raise DecodeError(f"binlog {where}: the descriptor event ({length} bytes) holds no consistent extra length")


def parse(data: bytes, where: str = "?") -> Binlog:
    """A whole binlog file -> its descriptor and the Parquet payload of each event."""
    buf = memoryview(data)
    if len(buf) < 4 + HEADER.size or struct.unpack_from("<I", buf, 0)[0] != MAGIC:
        raise DecodeError(f"binlog {where}: no magic number 0xfffabc at its start (not a storage v1 binlog)")
    _, code, length, _ = HEADER.unpack_from(buf, 4)
    if code != DESCRIPTOR_EVENT:
        raise DecodeError(f"binlog {where}: the first event is of type {code}, not the descriptor")
    desc = _descriptor(buf, 4, length, where)
    pos, payloads = 4 + length, []
    while pos < len(buf):
        if pos + HEADER.size > len(buf):
            raise DecodeError(f"binlog {where}: truncated event header at byte {pos}")
        _, code, length, nxt = HEADER.unpack_from(buf, pos)
        if code not in (INSERT_EVENT, DELETE_EVENT) or length < HEADER.size + EVENT_TS.size or pos + length > len(buf):
            raise DecodeError(f"binlog {where}: event at byte {pos} of type {code}, length {length} is not an "
                              f"insert or delete event within the file ({len(buf)} bytes)")
        body = buf[pos + HEADER.size + EVENT_TS.size:pos + length]
        payloads.append(pq.read_table(pa.BufferReader(pa.py_buffer(body))))
        pos = nxt if nxt > pos else pos + length
    return Binlog(desc, payloads)


def read_column(data: bytes, where: str = "?") -> tuple[Descriptor, pa.Array]:
    """An insert binlog's rows as one Arrow array (the payload's own type)."""
    log = parse(data, where)
    col = log.column()
    return log.descriptor, (col.combine_chunks() if col.num_chunks != 1 else col.chunk(0))


def read_deletes(data: bytes, where: str = "?", pk_is_string: bool = False) -> tuple[list, np.ndarray]:
    """A delete log's (primary keys, delete timestamps); ``pk_is_string`` decides the old ``pk,ts`` form's key."""
    log = parse(data, where)
    col = log.column()
    pks: list = []
    tss = np.zeros(len(col), dtype=np.uint64)
    for i, v in enumerate(col.to_pylist()):
        text = v.decode() if isinstance(v, bytes) else str(v)
        if text.startswith("{"):
            d = json.loads(text)
            pk, ts = d["pk"], int(d["ts"])
        else:  # the older "pk,ts" form
            k, _, t = text.rpartition(",")
            pk, ts = (k if pk_is_string else int(k)), int(t)
        pks.append(pk)
        tss[i] = ts
    return pks, tss
