"""A Delta table's first version written as its log file, from Parquet files already under its location.

delta-rs's ``create_table_with_add_actions`` refuses table properties outside the Delta protocol's own
keys, and ``convert_to_deltalake`` takes a whole directory without properties; the snapshot needs both
its data files and its ``msgstream.*`` properties in one atomic version 0. So this writes
``_delta_log/00000000000000000000.json`` itself (protocol 1/2, metaData, one add per file), publishing it
with a hard link that fails if the version already exists (a local or mounted file system).
"""

from __future__ import annotations

import json
import os
import time
import uuid
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq

from msgstream_spark.errors import MirrorError

FIRST = "00000000000000000000.json"


def data_files(location: str, paths: list[str], pk: str) -> tuple[pa.Schema, list[dict]]:
    """The files' common Arrow schema (which must hold the primary key ``pk``) and their ``add`` actions
    (paths relative to ``location``)."""
    root = os.path.abspath(location)
    schema, adds = None, []
    now = int(time.time() * 1000)
    for p in paths:
        full = os.path.abspath(p)
        if os.path.commonpath([root, full]) != root:
            raise MirrorError(f"data file {p} is not under the table location {location}")
        meta = pq.read_metadata(full)
        file_schema = meta.schema.to_arrow_schema().remove_metadata()
        if schema is None:
            schema = file_schema
        elif not file_schema.equals(schema):
            raise MirrorError(f"data file {p} has another schema than {paths[0]}: {file_schema} vs {schema}")
        adds.append({"add": {"path": os.path.relpath(full, root), "partitionValues": {}, "size": os.path.getsize(full),
                             "modificationTime": now, "dataChange": True,
                             "stats": json.dumps(file_stats(meta, pk, None))}})
    if schema is None:
        raise MirrorError("add_files needs at least one data file")
    if pk not in schema.names:
        raise MirrorError(f"the data files have no primary key column {pk!r}: {schema.names}")
    return schema, adds


def write_first_version(location: str, name: str, schema_json: str, configuration: dict[str, str],
                        adds: list[dict]) -> None:
    """Publish version 0; MirrorError if the table already has one."""
    log = os.path.join(location, "_delta_log")
    os.makedirs(log, exist_ok=True)
    now = int(time.time() * 1000)
    actions = [
        {"commitInfo": {"timestamp": now, "operation": "CREATE TABLE", "operationParameters": {"mode": "ErrorIfExists"},
                        "clientVersion": "msgstream-spark"}},
        {"protocol": {"minReaderVersion": 1, "minWriterVersion": 2}},
        {"metaData": {"id": str(uuid.uuid4()), "name": name, "format": {"provider": "parquet", "options": {}},
                      "schemaString": schema_json, "partitionColumns": [], "configuration": configuration,
                      "createdTime": now}},
        *adds,
    ]
    _publish(log, FIRST, actions, f"{location} already has a Delta table version 0: add_files makes a new table")


def write_replace_version(location: str, version: int, metadata: dict, schema_json: str,
                          removes: list[dict], adds: list[dict]) -> None:
    """Publish ``version``: every current data file removed, ``adds`` added, the metadata (same table id)
    with the new schema and configuration, in one commit file; MirrorError if another writer took it."""
    now = int(time.time() * 1000)
    actions = [
        {"commitInfo": {"timestamp": now, "operation": "WRITE", "operationParameters": {"mode": "Overwrite"},
                        "clientVersion": "msgstream-spark"}},
        {"metaData": {**metadata, "schemaString": schema_json}},
        *({"remove": r} for r in removes),
        *adds,
    ]
    _publish(os.path.join(location, "_delta_log"), f"{version:020d}.json", actions,
             f"{location}: Delta version {version} was written by another writer meanwhile; nothing replaced")


def _publish(log: str, name: str, actions: list[dict], taken: str) -> None:
    """Write ``actions`` as the commit file ``name`` atomically: a temporary file, fsync'd, hard-linked into place
    (which fails if the version exists: MirrorError ``taken``), then the directory fsync'd, so a power loss
    publishes the whole version or none."""
    tmp = os.path.join(log, f".{name}.{uuid.uuid4().hex}.tmp")
    target = os.path.join(log, name)
    with open(tmp, "w") as f:
        f.write("\n".join(json.dumps(a) for a in actions) + "\n")
        f.flush()
        os.fsync(f.fileno())
    try:
        os.link(tmp, target)
    except FileExistsError as e:
        raise MirrorError(taken) from e
    except OSError as e:  # a mount without hard links: no atomic create-if-absent there
        raise MirrorError(f"cannot publish the Delta commit {target}: the file system refused a hard link ({e}); "
                          "the snapshot's first version needs a local or mounted file system with hard links") from e
    finally:
        os.unlink(tmp)
    fsync_path(log)


def fsync_path(path: str) -> None:
    """fsync a file or a directory (a new entry in it survives a power loss)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LogState:
    """The live ``add`` actions of a Delta table (path -> action, with its deletion vector descriptor), read from
    its log: the last checkpoint, then the JSON commits after it, and later only the commits added since
    (delta-rs exposes neither the deletion vector descriptors nor the adds' tags that a ``remove`` must repeat)."""

    def __init__(self, location: str) -> None:
        self.location = location
        self.version = -1
        self.files: dict[str, dict] = {}
        self.txns: dict[str, int] = {}

    def refresh(self) -> LogState:
        log = os.path.join(self.location, "_delta_log")
        if self.version < 0:
            self._from_checkpoint(log)
        v = self.version + 1
        while True:
            path = os.path.join(log, f"{v:020d}.json")
            try:
                with open(path) as f:
                    lines = f.read().splitlines()
            except FileNotFoundError:
                break
            for line in lines:
                if line.strip():
                    self._apply(json.loads(line))
            self.version = v
            v += 1
        return self

    def _apply(self, action: dict) -> None:
        if "add" in action:
            a = action["add"]
            self.files[unquote(a["path"])] = a
        elif "txn" in action:
            self.txns[action["txn"]["appId"]] = int(action["txn"]["version"])
        elif "remove" in action:
            r = action["remove"]
            cur = self.files.get(unquote(r["path"]))
            if cur is not None and _dv_id(cur.get("deletionVector")) == _dv_id(r.get("deletionVector")):
                del self.files[unquote(r["path"])]

    def _from_checkpoint(self, log: str) -> None:
        v, names = checkpoint_parts(log)
        if v < 0:
            return
        for name in names:
            t = pq.read_table(os.path.join(log, name))
            for a in t.column("add").to_pylist() if "add" in t.column_names else []:
                if a is not None:
                    a = _from_parquet_action(a)
                    self.files[unquote(a["path"])] = a
            for x in t.column("txn").to_pylist() if "txn" in t.column_names else []:
                if x is not None:
                    self.txns[x["appId"]] = int(x["version"])
        self.version = v


def checkpoint_parts(log: str) -> tuple[int, list[str]]:
    """(version, file names) of the last checkpoint in the ``_delta_log`` directory ``log``; (-1, []): none."""
    try:
        with open(os.path.join(log, "_last_checkpoint")) as f:
            last = json.load(f)
    except FileNotFoundError:
        return -1, []
    v = int(last["version"])
    parts = int(last.get("parts") or 1)
    return v, ([f"{v:020d}.checkpoint.parquet"] if parts == 1 else
               [f"{v:020d}.checkpoint.{i:010d}.{parts:010d}.parquet" for i in range(1, parts + 1)])


_ADD_KEYS = ("path", "partitionValues", "size", "modificationTime", "dataChange", "stats", "tags", "deletionVector",
             "baseRowId", "defaultRowCommitVersion", "clusteringProvider")


def _from_parquet_action(a: dict) -> dict:
    """A checkpoint's ``add`` row as the JSON action (maps come from Arrow as lists of pairs)."""
    out = {}
    for k in _ADD_KEYS:
        v = a.get(k)
        if v is None:
            continue
        if k in ("partitionValues", "tags") and isinstance(v, list):
            v = dict(v)
        if k == "deletionVector":
            v = {dk: dv for dk, dv in v.items() if dv is not None}
        out[k] = v
    out.setdefault("partitionValues", {})
    return out


def _dv_id(dv: dict | None) -> tuple | None:
    if not dv:
        return None
    return dv.get("storageType"), dv.get("pathOrInlineDv"), dv.get("offset")


def write_commit(location: str, version: int, actions: list[dict], operation: str, info: dict) -> None:
    """Publish ``actions`` as Delta version ``version`` (``info`` in its commitInfo, as delta-rs puts a commit's
    custom metadata); MirrorError if another writer took it."""
    now = int(time.time() * 1000)
    info = {"commitInfo": {"timestamp": now, "operation": operation, "operationParameters": {},
                           "clientVersion": "msgstream-spark", **info}}
    _publish(os.path.join(location, "_delta_log"), f"{version:020d}.json", [info, *actions],
             f"{location}: Delta version {version} was written by another writer meanwhile; nothing committed "
             "(one writer per table: see docs/mirror.md)")


# the features a legacy protocol supports (Delta PROTOCOL.md, "Table Features": the features and the legacy
# versions that support them), listed when a table moves to reader 3 / writer 7: writer features by the writer
# version that brought them; columnMapping, a reader-writer feature, needs reader 2 and writer 5
_WRITER_ONLY = {2: ["appendOnly", "invariants"], 3: ["checkConstraints"], 4: ["changeDataFeed", "generatedColumns"],
                6: ["identityColumns"]}
_READER_WRITER = {"columnMapping": (2, 5)}


def legacy_features(reader: int, writer: int, listed: list[str] | None = None) -> tuple[list[str], list[str]]:
    """(reader features, writer features) a legacy protocol supports; a version already at reader 3 / writer 7
    lists its own (``listed``: a writer 7's features; nothing implied)."""
    writes = [f for v, fs in sorted(_WRITER_ONLY.items()) if v <= writer for f in fs] if writer < 7 else []
    both = [f for f, (r, w) in _READER_WRITER.items()
            if reader >= r and (writer >= w if writer < 7 else f in (listed or []))]
    return ([] if reader >= 3 else both), ([] if writer >= 7 else writes + both)


def _plain(v: object) -> object:
    if isinstance(v, (int, float, str, bool)) or v is None:
        return v
    return str(v)


def file_stats(meta, pk: str, tight: bool | None) -> dict:
    """Delta stats of a Parquet file from its footer: rows, and the key's bounds (what the lookup prunes by);
    ``tightBounds`` only when given (a table with deletion vectors)."""
    stats: dict = {"numRecords": meta.num_rows}
    if tight is not None:
        stats["tightBounds"] = tight
    schema = meta.schema.to_arrow_schema()
    if pk not in schema.names:
        return stats
    col = schema.get_field_index(pk)
    lo = hi = None
    nulls = 0
    for g in range(meta.num_row_groups):
        st = meta.row_group(g).column(col).statistics
        if st is None or not st.has_min_max:
            return stats
        lo = st.min if lo is None else min(lo, st.min)
        hi = st.max if hi is None else max(hi, st.max)
        nulls += st.null_count or 0
    if lo is not None:
        stats.update(minValues={pk: _plain(lo)}, maxValues={pk: _plain(hi)}, nullCount={pk: nulls})
    return stats


def new_add(root: str, path: str, pk: str, now: int, dv: dict | None) -> dict:
    """The ``add`` action of a data file a task wrote (stats from its footer: rows, the key's bounds)."""
    stats = file_stats(pq.read_metadata(path), pk, dv is None)
    add = {"path": os.path.relpath(path, root), "partitionValues": {}, "size": os.path.getsize(path),
           "modificationTime": now, "dataChange": True, "stats": json.dumps(stats)}
    if dv is not None:
        add["deletionVector"] = dv
    return add


def loose_stats(stats: str | None) -> str | None:
    """A file's stats once rows of it are deleted: the bounds stay true bounds but are no longer tight."""
    if not stats:
        return stats
    d = json.loads(stats)
    d["tightBounds"] = False
    return json.dumps(d)


def removal(add: dict, now: int) -> dict:
    """The ``remove`` of a live ``add`` (it repeats the file's deletion vector, which identifies it)."""
    r = {"path": add["path"], "deletionTimestamp": now, "dataChange": True, "extendedFileMetadata": True,
         "partitionValues": add.get("partitionValues") or {}, "size": add.get("size")}
    if add.get("deletionVector"):
        r["deletionVector"] = add["deletionVector"]
    return r
