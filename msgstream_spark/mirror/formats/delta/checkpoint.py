"""A Delta checkpoint written by the mirror: once, at its final name, already without expired tombstones.

A classic single-file checkpoint (PROTOCOL.md, "Checkpoints") is ``_delta_log/<version>.checkpoint.parquet``:
one row per action of the table's state at that version (its ``protocol``, its ``metaData``, each application's
latest ``txn``, its live ``domainMetadata``, every live ``add``, and the ``remove`` tombstones not yet expired),
each kind a nullable struct column; ``_last_checkpoint`` then names it (``version``, ``size``: its rows, and
``sizeInBytes``, ``numOfAddFiles``, as delta-rs writes them). The schema below is the one delta-rs 1.x writes,
field by field (its nullability included), so delta-rs, DuckDB's ``delta`` extension (delta-kernel) and
``LogState`` read it as they read delta-rs's.

The rows come from the writer's ``LogState`` at the version just committed (the last checkpoint read, then every
commit since: nothing is read again). A tombstone is kept while it is younger than
``delta.deletedFileRetentionDuration`` (what delta-rs keeps) and removed after the job's expiry floor (the files
removed at or before it are deleted and no kept version reads them: ``delta/upkeep.expired``): so the checkpoint is
written once, pruned, by create-if-absent, before ``_last_checkpoint`` names it. A reader never sees a first,
unpruned file (delta-rs's checkpoint rewritten left a moment in which ``_last_checkpoint`` named a size the
file no longer had). A table whose protocol asks for v2 checkpoints gets delta-rs's own (the caller's).
"""

from __future__ import annotations

import json
import logging

import pyarrow as pa
import pyarrow.parquet as pq

from msgstream_spark.mirror.formats.delta.log import LogState, log_uri
from msgstream_spark.mirror.formats.delta.retention import TOMBSTONE_RETENTION_KEY, interval_ms
from msgstream_spark.mirror.store import AlreadyExists, Store

log = logging.getLogger(__name__)

_S, _L = pa.string(), pa.int64()


def _map(name: str, values_null: bool = True) -> pa.DataType:
    """A string map (``name``: delta-rs names the map's entries after the field; Parquet readers do not read it)."""
    return pa.map_(pa.field("key", _S, nullable=False), pa.field("value", _S, values_null))


def _f(name: str, t: pa.DataType, null: bool = True) -> pa.Field:
    return pa.field(name, t, nullable=null)


_DV = pa.struct([_f("storageType", _S, False), _f("pathOrInlineDv", _S, False), _f("offset", pa.int32()),
                 _f("sizeInBytes", pa.int32(), False), _f("cardinality", _L, False)])
_STR_LIST = pa.list_(pa.field("element", _S, nullable=False))
SCHEMA = pa.schema([
    _f("add", pa.struct([_f("path", _S, False), _f("partitionValues", _map("partitionValues"), False),
                         _f("size", _L, False), _f("modificationTime", _L, False), _f("dataChange", pa.bool_(), False),
                         _f("stats", _S), _f("tags", _map("tags")), _f("deletionVector", _DV), _f("baseRowId", _L),
                         _f("defaultRowCommitVersion", _L), _f("clusteringProvider", _S)])),
    _f("remove", pa.struct([_f("path", _S, False), _f("deletionTimestamp", _L), _f("dataChange", pa.bool_(), False),
                            _f("extendedFileMetadata", pa.bool_()), _f("partitionValues", _map("partitionValues")),
                            _f("size", _L), _f("stats", _S), _f("tags", _map("tags")), _f("deletionVector", _DV),
                            _f("baseRowId", _L), _f("defaultRowCommitVersion", _L)])),
    _f("metaData", pa.struct([
        _f("id", _S, False), _f("name", _S), _f("description", _S),
        _f("format", pa.struct([_f("provider", _S, False), _f("options", _map("options", False), False)]), False),
        _f("schemaString", _S, False), _f("partitionColumns", _STR_LIST, False), _f("createdTime", _L),
        _f("configuration", _map("configuration", False), False)])),
    _f("protocol", pa.struct([_f("minReaderVersion", pa.int32(), False), _f("minWriterVersion", pa.int32(), False),
                              _f("readerFeatures", _STR_LIST), _f("writerFeatures", _STR_LIST)])),
    _f("txn", pa.struct([_f("appId", _S, False), _f("version", _L, False), _f("lastUpdated", _L)])),
    _f("domainMetadata", pa.struct([_f("domain", _S, False), _f("configuration", _S, False),
                                    _f("removed", pa.bool_(), False)])),
    _f("sidecar", pa.struct([_f("path", _S, False), _f("sizeInBytes", _L, False), _f("modificationTime", _L, False),
                             _f("tags", _map("tags"))])),
])


def wants_v2(state: LogState) -> bool:
    """Whether the table's protocol asks for v2 checkpoints (a classic one is not what its readers expect)."""
    p = state.protocol or {}
    return "v2Checkpoint" in (p.get("writerFeatures") or []) or "v2Checkpoint" in (p.get("readerFeatures") or [])


def _struct(kind: str, action: dict) -> dict:
    """A JSON action as its checkpoint struct: the schema's fields only, maps as lists of pairs."""
    t = SCHEMA.field(kind).type
    out = {}
    for f in t:
        v = action.get(f.name)
        if isinstance(v, dict) and pa.types.is_map(f.type):
            v = list(v.items())
        elif isinstance(v, dict) and pa.types.is_struct(f.type):
            v = {g.name: (list(v.get(g.name).items()) if pa.types.is_map(g.type) and isinstance(v.get(g.name), dict)
                          else v.get(g.name)) for g in f.type}
        out[f.name] = v
    return out


def tombstones(state: LogState, now_ms: int, floor_ms: int | None) -> list[dict]:
    """The tombstones a checkpoint written now carries (younger than the table's retention, removed after the
    expiry's floor); the others are forgotten by ``state`` too (it holds what the next checkpoint may carry)."""
    conf = (state.metadata or {}).get("configuration") or {}
    cutoff = max(now_ms - interval_ms(conf.get(TOMBSTONE_RETENTION_KEY)), floor_ms if floor_ms is not None else -1)
    for k in [k for k, r in state.removes.items() if int(r.get("deletionTimestamp") or 0) <= cutoff]:
        del state.removes[k]
    return list(state.removes.values())


def write(store: Store, root: str, state: LogState, version: int, now_ms: int, floor_ms: int | None) -> dict:
    """Write the checkpoint of ``version`` (``state`` is the table at that version) and name it in
    ``_last_checkpoint``; what ``_last_checkpoint`` now says. A checkpoint of that version already there (a
    retry after a crash between the two writes) is kept as it is and named."""
    if state.version != version or state.protocol is None or state.metadata is None:
        raise ValueError(f"{root}: the log state is at version {state.version}, not {version} with its protocol "
                         "and metadata: no checkpoint written")
    rows = [{"protocol": _struct("protocol", state.protocol)}, {"metaData": _struct("metaData", state.metadata)}]
    rows += [{"txn": _struct("txn", t)} for t in state.txn_actions.values()]
    rows += [{"domainMetadata": _struct("domainMetadata", d)} for d in state.domains.values()]
    rows += [{"add": _struct("add", a)} for a in state.files.values()]
    dropped = len(state.removes)
    kept = tombstones(state, now_ms, floor_ms)
    rows += [{"remove": _struct("remove", r)} for r in kept]
    t = pa.Table.from_pylist(rows, schema=SCHEMA)
    sink = pa.BufferOutputStream()
    pq.write_table(t, sink, compression="snappy")
    body = sink.getvalue().to_pybytes()
    name = log_uri(root, f"{version:020d}.checkpoint.parquet")
    last = {"version": version, "size": t.num_rows, "sizeInBytes": len(body), "numOfAddFiles": len(state.files)}
    try:
        store.put_if_absent(name, body)
    except AlreadyExists:
        data, _ = store.get(name)
        meta = pq.ParquetFile(pa.BufferReader(data)).metadata
        log.info("%s: checkpoint %d is there already (written before a restart): kept, and named", root, version)
        last = {"version": version, "size": meta.num_rows, "sizeInBytes": len(data)}
    store.put(log_uri(root, "_last_checkpoint"), json.dumps(last, separators=(",", ":")).encode())
    log.info("%s: checkpoint %d written: %d file(s), %d tombstone(s) (%d expired or removed at or before the "
             "expiry's floor left out)", root, version, len(state.files), len(kept), dropped - len(kept))
    return last
