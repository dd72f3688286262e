"""Messages and positions as JSON (what ``tail``, ``inspect`` and ``position`` print)."""

from __future__ import annotations

import base64
import datetime
import json
from typing import Any

from google.protobuf import json_format

from msgstream_spark.errors import DecodeError
from msgstream_spark.msg import tso
from msgstream_spark.msg.columns import GEOMETRY, field_data_to_arrow
from msgstream_spark.msg.pb import common_pb2
from msgstream_spark.msg.structs import rebuild_structs, struct_arrow_type, structs_from_columns
from msgstream_spark.msg.wkb import to_wkt


def _jsonable(v: Any) -> Any:
    if isinstance(v, bytes):
        return base64.b64encode(v).decode()
    if isinstance(v, datetime.datetime):  # a Timestamptz value (UTC)
        return v.isoformat()
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if hasattr(v, "item"):  # numpy scalar
        return v.item()
    return v


def message_dict(msg, *, channel: str | None = None, msg_id: bytes | None = None,
                 properties: dict | None = None, rows: bool = False, full: bool = False) -> dict[str, Any]:
    """A decoded TsMsg as a JSON-ready dict: type, ids, timestamps, counts (and rows on request).

    A Milvus 2.6 WAL message also gets ``wal``: its envelope (version, type, time tick, vchannel,
    transaction, broadcast, ...).
    """
    proto = msg.proto
    out: dict[str, Any] = {}
    if channel is not None:
        out["channel"] = channel
    if msg_id is not None:
        out["msgID"] = base64.b64encode(msg_id).decode()
    if proto is None:  # a WAL message without a 2.5 body (DDL, maintenance, transaction control, newer types)
        return _wal_only_dict(msg, out, properties, full)
    base = getattr(proto, "base", None)
    ts = int(base.timestamp) if base is not None else 0
    out["msg_type"] = _type_name(proto)
    out["timestamp"] = ts
    if ts:
        out["time"] = tso.to_datetime(ts).isoformat()
    if base is not None and base.msgID:
        out["base_msg_id"] = int(base.msgID)
    for name in ("shardName", "collection_name", "collectionID", "partition_name", "partitionID", "num_rows"):
        if hasattr(proto, name):
            val = getattr(proto, name)
            if val not in ("", 0):
                out[name] = int(val) if isinstance(val, int) else val
    if msg.wal is not None:
        out["wal"] = envelope_dict(msg.wal)
    if properties:
        out["properties"] = dict(properties)
    if rows:
        out["rows"] = _rows(proto)
    if full:
        out["proto"] = json_format.MessageToDict(proto, preserving_proto_field_name=True)
    return out


def _wal_only_dict(msg, out: dict[str, Any], properties: dict | None, full: bool) -> dict[str, Any]:
    env = msg.wal
    out["msg_type"] = env.type_name
    out["timestamp"] = int(env.time_tick)
    out["time"] = tso.to_datetime(env.time_tick).isoformat()
    out["body_bytes"] = len(msg.body)
    out["wal"] = envelope_dict(env)
    schema = _schema_fields(msg)
    if schema:
        out["schema_fields"] = schema
    if properties:
        out["properties"] = dict(properties)
    if full:
        out["body"] = msg.body
    return out


def _schema_fields(msg) -> list[str] | str | None:
    try:
        schema = msg.schema
    except DecodeError as exc:
        return f"undecodable: {exc.reason}"
    return [f.name for f in schema.fields] if schema is not None else None


def envelope_dict(env) -> dict[str, Any]:
    """The properties of a 2.6 WAL message, decoded (the cipher's wrapped key is never shown)."""
    out: dict[str, Any] = {"version": env.version, "type": env.type_name, "type_id": int(env.msg_type),
                           "time_tick": int(env.time_tick), "vchannel": env.vchannel}
    if env.is_control_vchannel:
        out["control_vchannel"] = True
    if env.last_confirmed:
        out["last_confirmed"] = env.last_confirmed
    if env.last_confirmed_self:
        out["last_confirmed_self"] = True
    for key in ("barrier_time_tick", "wal_term"):
        if getattr(env, key) is not None:
            out[key] = int(getattr(env, key))
    if env.txn is not None:
        out["txn"] = {"txn_id": env.txn.txn_id, "keepalive_ms": env.txn.keepalive_milliseconds}
    if env.broadcast is not None:
        out["broadcast"] = {"broadcast_id": env.broadcast.broadcast_id, "vchannels": list(env.broadcast.vchannels)}
    if env.cipher is not None:
        out["encrypted"] = {"ez_id": env.cipher.ez_id, "collection_id": env.cipher.collection_id}
    if env.replicate is not None:
        out["replicated_from"] = env.replicate.cluster_id
    for flag in ("not_persisted", "pchannel_level"):
        if getattr(env, flag):
            out[flag] = True
    try:
        header = env.header_fields
    except DecodeError as exc:
        out["header_error"] = exc.reason
    else:
        if header:
            out["header"] = header
    if env.extra:
        out["extra"] = dict(env.extra)
    return out


def _type_name(proto) -> str:
    base = getattr(proto, "base", None)
    try:
        return common_pb2.MsgType.Name(base.msg_type) if base is not None else type(proto).__name__
    except ValueError:
        return str(base.msg_type)


def _rows(proto) -> list[dict[str, Any]]:
    """Rows of an insert (columns from FieldData) or the primary keys of a delete."""

    if proto.DESCRIPTOR.name == "InsertRequest":
        arrays = {fd.field_name: field_data_to_arrow(fd) for fd in proto.fields_data}
        structs = structs_from_columns(list(proto.fields_data))  # ``struct[sub]`` columns -> one struct array
        if structs:
            rebuild_structs(arrays, [(ss.name, struct_arrow_type(ss)) for ss in structs])
            for ss in structs:
                for sub in ss.fields:
                    arrays.pop(sub.name, None)
        cols = {name: arr.to_pylist() for name, arr in arrays.items()}
        for fd in proto.fields_data:  # Geometry (WKB) shows as WKT
            if int(fd.type) == GEOMETRY and fd.field_name in cols:
                cols[fd.field_name] = [to_wkt(v) for v in cols[fd.field_name]]
        n = int(proto.num_rows)
        return [{k: _jsonable(v[i]) for k, v in cols.items()} for i in range(n)]
    if proto.DESCRIPTOR.name == "DeleteRequest":
        ids = proto.primary_keys
        keys = list(ids.int_id.data) if ids.HasField("int_id") else list(ids.str_id.data)
        return [{"pk": k} for k in keys]
    return []


def position_dict(pos) -> dict[str, Any]:
    """MsgPosition as its JSON form plus the base64 protobuf (Milvus checkpoint form)."""
    d = dict(pos.to_json_dict())
    d["base64"] = pos.to_base64()
    return d


def dumps(obj: Any) -> str:
    return json.dumps(_jsonable(obj), separators=(",", ":"), ensure_ascii=False)
