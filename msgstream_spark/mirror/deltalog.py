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
                             "stats": json.dumps({"numRecords": meta.num_rows})}})
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
                          removes: list[str], adds: list[dict]) -> None:
    """Publish ``version``: every current data file removed, ``adds`` added, the metadata (same table id)
    with the new schema and configuration, in one commit file; MirrorError if another writer took it."""
    now = int(time.time() * 1000)
    actions = [
        {"commitInfo": {"timestamp": now, "operation": "WRITE", "operationParameters": {"mode": "Overwrite"},
                        "clientVersion": "msgstream-spark"}},
        {"metaData": {**metadata, "schemaString": schema_json}},
        *({"remove": {"path": p, "deletionTimestamp": now, "dataChange": True}} for p in removes),
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
    _fsync_dir(log)


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
