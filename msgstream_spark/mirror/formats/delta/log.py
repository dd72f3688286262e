"""A Delta table's log on its store: version files published by create-if-absent, read back as ``LogState``.

Every version is one object ``_delta_log/<version>.json`` created by the store's put-if-absent (a local file
system: a hard link that fails if the name exists; S3: ``PUT`` with ``If-None-Match: *``; GCS, Azure: their
create-only preconditions), the rule delta-rs 1.x uses too: of two writers racing for one version exactly one
creates it, the other gets an error and commits nothing. The log is read by ``read`` until a version is not
there; checkpoints (``_last_checkpoint`` and its Parquet parts) are read whole through the store.

delta-rs's ``create_table_with_add_actions`` refuses table properties outside the Delta protocol's own keys,
and ``convert_to_deltalake`` takes a whole directory without properties; the snapshot needs both its data files
and its ``msgstream.*`` properties in one atomic version 0. So this writes version 0 itself (protocol 1/2,
metaData, one add per file).
"""

from __future__ import annotations

import json
import time
import uuid
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.common import PROP_WRITER_EPOCH, check_epoch
from msgstream_spark.mirror.store import AlreadyExists, NotFound, Store, StoreError, uri
from msgstream_spark.mirror.store.parquet import footer, key_stats

FIRST = "00000000000000000000.json"
EPOCH_TRIES = 10  # versions a writer epoch's publication tries, each lost to another writer's commit
LOG_DIR = "_delta_log"


def log_uri(root: str, name: str = "") -> str:
    """The URI of ``name`` in the table's ``_delta_log``."""
    return uri.join(root, LOG_DIR, name) if name else uri.join(root, LOG_DIR)


def data_files(store: Store, root: str, paths: list[str], pk: str) -> tuple[pa.Schema, list[dict]]:
    """The files' common Arrow schema (which must hold the primary key ``pk``) and their ``add`` actions
    (paths relative to ``root``; rows, size and the key's bounds from each footer, read by range)."""
    schema, adds = None, []
    now = int(time.time() * 1000)
    for p in paths:
        rel = uri.relative(root, p)
        if rel is None:
            raise MirrorError(f"data file {p} is not under the table location {root}")
        size, meta = footer(store, uri.join(root, rel))
        file_schema = meta.schema.to_arrow_schema().remove_metadata()
        if schema is None:
            schema = file_schema
        elif not file_schema.equals(schema):
            raise MirrorError(f"data file {p} has another schema than {paths[0]}: {file_schema} vs {schema}")
        adds.append({"add": new_add(rel, size, json.dumps(key_stats(meta, pk)), now, None)})
    if schema is None:
        raise MirrorError("add_files needs at least one data file")
    if pk not in schema.names:
        raise MirrorError(f"the data files have no primary key column {pk!r}: {schema.names}")
    return schema, adds


def write_first_version(store: Store, root: str, name: str, schema_json: str, configuration: dict[str, str],
                        adds: list[dict]) -> None:
    """Publish version 0; MirrorError if the table already has one."""
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
    _publish(store, log_uri(root, FIRST), actions, f"{root} already has a Delta table version 0: add_files makes a "
             "new table")


def write_replace_version(store: Store, root: str, version: int, metadata: dict, schema_json: str,
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
    _publish(store, log_uri(root, f"{version:020d}.json"), actions,
             f"{root}: Delta version {version} was written by another writer meanwhile; nothing replaced")


def _publish(store: Store, target: str, actions: list[dict], taken: str) -> None:
    """Create the commit file ``target`` with ``actions`` if it does not exist (the store's put-if-absent: the
    whole version or none, and of two writers of one version exactly one); MirrorError ``taken`` if it does."""
    try:
        store.put_if_absent(target, ("\n".join(json.dumps(a) for a in actions) + "\n").encode())
    except AlreadyExists as e:
        raise MirrorError(taken) from e
    except StoreError as e:
        raise StoreError(f"cannot publish the Delta commit {target}: {e}") from e


class LogState:
    """The live ``add`` actions of a Delta table (path -> action, with its deletion vector descriptor), read from
    its log: the last checkpoint, then the JSON commits after it, and later only the commits added since
    (delta-rs exposes neither the deletion vector descriptors nor the adds' tags that a ``remove`` must repeat)."""

    def __init__(self, store: Store, root: str) -> None:
        self.store, self.location = store, root
        self.version = -1
        self.files: dict[str, dict] = {}
        self.txns: dict[str, int] = {}
        self.checkpoint = -1  # the version of the newest checkpoint this state knows (read from, or written)
        # what else a checkpoint of this version holds (delta/checkpoint writes it from these): the protocol, the
        # metadata, each app's txn, the domains, the remove tombstones by (path, deletion vector)
        self.protocol: dict | None = None
        self.metadata: dict | None = None
        self.txn_actions: dict[str, dict] = {}
        self.domains: dict[str, dict] = {}
        self.removes: dict[tuple, dict] = {}

    def refresh(self) -> LogState:
        if self.version < 0:
            self._from_checkpoint()
        v = self.version + 1
        while True:
            try:
                lines = self.store.read(log_uri(self.location, f"{v:020d}.json")).decode().splitlines()
            except NotFound:
                break
            for line in lines:
                if line.strip():
                    self._apply(json.loads(line))
            self.version = v
            v += 1
        return self

    def adopt(self, version: int, actions: list[dict]) -> None:
        """Take version ``version`` (the next one), which this writer has just published with ``actions``, as
        read: the next refresh starts after it (reading it back cost a GET per batch of a commit as large as the
        files the batch touched: on a large table every file)."""
        if version != self.version + 1:
            raise ValueError(f"Delta version {version} is not the next one after {self.version}")
        for a in json.loads(json.dumps(actions)):  # as a reader of the published JSON would have them
            self._apply(a)
        self.version = version

    def _apply(self, action: dict) -> None:
        if "add" in action:
            a = action["add"]
            self.files[unquote(a["path"])] = a
            self.removes.pop((unquote(a["path"]), dv_id(a.get("deletionVector"))), None)
        elif "txn" in action:
            self.txns[action["txn"]["appId"]] = int(action["txn"]["version"])
            self.txn_actions[action["txn"]["appId"]] = action["txn"]
        elif "remove" in action:
            r = action["remove"]
            cur = self.files.get(unquote(r["path"]))
            if cur is not None and dv_id(cur.get("deletionVector")) == dv_id(r.get("deletionVector")):
                del self.files[unquote(r["path"])]
            self.removes[(unquote(r["path"]), dv_id(r.get("deletionVector")))] = r
        elif "metaData" in action:
            self.metadata = action["metaData"]
        elif "protocol" in action:
            self.protocol = action["protocol"]
        elif "domainMetadata" in action:
            d = action["domainMetadata"]
            if d.get("removed"):
                self.domains.pop(d["domain"], None)
            else:
                self.domains[d["domain"]] = d

    def _from_checkpoint(self) -> None:
        v, names = checkpoint_parts(self.store, self.location)
        if v < 0:
            return
        for name in names:
            t = pq.read_table(pa.BufferReader(self.store.read(log_uri(self.location, name))))
            for kind in ("protocol", "metaData", "domainMetadata", "txn", "remove", "add"):  # an add outranks
                for a in t.column(kind).to_pylist() if kind in t.column_names else []:
                    if a is not None:
                        self._apply({kind: _from_parquet_action(a) if kind == "add" else _json_form(a)})
        self.version = self.checkpoint = v


def checkpoint_parts(store: Store, root: str) -> tuple[int, list[str]]:
    """(version, file names in ``_delta_log``) of the table's last checkpoint; (-1, []): none."""
    try:
        last = json.loads(store.read(log_uri(root, "_last_checkpoint")))
    except NotFound:
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


def _json_form(v):
    """A checkpoint row's struct as its JSON action: maps (Arrow's lists of pairs) as objects, nulls left out."""
    if isinstance(v, dict):
        return {k: (dict(x) if k in _MAPS and isinstance(x, list) else _json_form(x)) for k, x in v.items()
                if x is not None}
    return v


_MAPS = ("partitionValues", "tags", "options", "configuration")


def dv_id(dv: dict | None) -> tuple | None:
    """A deletion vector descriptor's identity (None: no vector)."""
    if not dv:
        return None
    return dv.get("storageType"), dv.get("pathOrInlineDv"), dv.get("offset")


def write_commit(store: Store, root: str, version: int, actions: list[dict], operation: str, info: dict) -> None:
    """Publish ``actions`` as Delta version ``version`` (``info`` in its commitInfo, as delta-rs puts a commit's
    custom metadata); MirrorError if another writer took it."""
    now = int(time.time() * 1000)
    info = {"commitInfo": {"timestamp": now, "operation": operation, "operationParameters": {},
                           "clientVersion": "msgstream-spark", **info}}
    _publish(store, log_uri(root, f"{version:020d}.json"), [info, *actions],
             f"{root}: Delta version {version} was written by another writer meanwhile; nothing committed "
             "(one writer per table: see docs/mirror.md)")


def write_epoch(store: Store, root: str, state: LogState, epoch: int, location: str) -> bool:
    """Publish writer epoch ``epoch`` in a version of its own (a ``txn`` of app id ``msgstream.writer_epoch``),
    unless the table has it already (False); LeaseLost if it has a higher one. A version lost to another writer's
    commit (a deposed writer's, which lands before the epoch or never) is tried again after it."""
    for _ in range(EPOCH_TRIES):
        state.refresh()
        have = state.txns.get(PROP_WRITER_EPOCH, 0)
        check_epoch(location, have, epoch, f"publishing writer epoch {epoch}")
        if have == epoch:
            return False
        actions = [{"txn": {"appId": PROP_WRITER_EPOCH, "version": int(epoch), "lastUpdated": int(time.time() * 1000)}}]
        try:
            write_commit(store, root, state.version + 1, actions, "WRITER EPOCH", {PROP_WRITER_EPOCH: str(epoch)})
        except MirrorError as e:
            if isinstance(e.__cause__, AlreadyExists):
                continue
            raise
        state.adopt(state.version + 1, actions)
        return True
    raise MirrorError(f"table {location}: writer epoch {epoch} was not published: another writer took each of "
                      f"{EPOCH_TRIES} Delta versions it tried; nothing deleted")


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


def new_add(rel: str, size: int, stats: str, now: int, dv: dict | None) -> dict:
    """The ``add`` action of a data file (``rel``: its path under the table; ``stats``: its rows and key bounds,
    ``files.key_stats``' JSON), ``tightBounds`` recorded when it has no deletion vector."""
    st = json.loads(stats)
    st["tightBounds"] = dv is None
    add = {"path": rel, "partitionValues": {}, "size": int(size), "modificationTime": now, "dataChange": True,
           "stats": json.dumps(st)}
    if dv is not None:
        add["deletionVector"] = dv
    return add


def add_of(store: Store, root: str, path: str, pk: str, now: int, dv: dict | None,
           written: tuple[int, str] | None = None) -> dict:
    """The ``add`` of a data file a writer wrote under ``root``: size and stats as the writer reported them
    (``written``), else from its footer."""
    rel = uri.relative(root, path)
    if rel is None:
        raise MirrorError(f"data file {path} is not under the table location {root}")
    if written is None:
        size, meta = footer(store, path)
        written = (size, json.dumps(key_stats(meta, pk)))
    return new_add(rel, written[0], written[1], now, dv)


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


def enable_dvs(protocol: dict, metadata: dict) -> list[dict]:
    """The protocol and metadata actions that turn deletion vectors on (none if they are: once per table), from
    the log's current ones: reader 3 / writer 7, listing the features the table's legacy versions supported (the
    protocol's table) and deletion vectors; the metadata as it is, ``delta.enableDeletionVectors`` set."""
    if "deletionVectors" in (protocol.get("readerFeatures") or []):
        return []
    implied_reader, implied_writer = legacy_features(protocol["minReaderVersion"], protocol["minWriterVersion"],
                                                     protocol.get("writerFeatures"))
    writer = sorted({*(protocol.get("writerFeatures") or []), "deletionVectors", *implied_writer})
    reader = sorted({*(protocol.get("readerFeatures") or []), "deletionVectors", *implied_reader})
    meta = {**metadata, "configuration": {**(metadata.get("configuration") or {}),
                                          "delta.enableDeletionVectors": "true"}}
    return [{"protocol": {"minReaderVersion": 3, "minWriterVersion": 7, "readerFeatures": reader,
                          "writerFeatures": writer}},
            {"metaData": meta}]


def key_bounds(raw_stats: str, pk: str) -> tuple:
    """(key min, key max, rows) of an add's stats JSON (None bounds: no stats)."""
    stats = json.loads(raw_stats)
    return (stats.get("minValues", {}).get(pk), stats.get("maxValues", {}).get(pk),
            int(stats.get("numRecords") or 0))
