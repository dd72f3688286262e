"""Marshal / unmarshal TsMsgs exactly as Milvus 2.5's msgstream does (wire doc §5.3, §6.1).

Payload = the serialized request protobuf; properties = ``{"msg_type": <enum name>}``.
Decoding takes the type from the ``msg_type`` property and falls back to the payload's
``MsgBase`` header when the property is absent or unknown (Broadcast, older Milvus).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from google.protobuf.message import DecodeError as PbDecodeError

from msgstream_spark.errors import DecodeError, UnknownMessageTypeError
from msgstream_spark.msg import vecview
from msgstream_spark.msg.columns import FLOAT_VECTOR, field_data_rows, field_level_validity, is_known_type, type_name
from msgstream_spark.msg.pb import common_pb2, msg_pb2
from msgstream_spark.msg.types import (
    CreateCollectionMsg,
    CreatePartitionMsg,
    DeleteMsg,
    DropCollectionMsg,
    DropPartitionMsg,
    InsertMsg,
    MsgType,
    TimeTickMsg,
    TsMsg,
)
from msgstream_spark.msg.wire import encode_varint, iter_fields, read_varint

__all__ = ["encode_varint", "header_msg_type", "iter_fields", "marshal", "msg_type_name", "peek_msg_type",
           "read_varint", "unmarshal"]

MSG_TYPE_KEY = "msg_type"
WAL_VERSION_KEY = "_v"

_CLASSES: dict[int, type[TsMsg]] = {
    MsgType.Insert: InsertMsg,
    MsgType.Delete: DeleteMsg,
    MsgType.TimeTick: TimeTickMsg,
    MsgType.CreateCollection: CreateCollectionMsg,
    MsgType.DropCollection: DropCollectionMsg,
    MsgType.CreatePartition: CreatePartitionMsg,
    MsgType.DropPartition: DropPartitionMsg,
}


_PROTOS: dict[int, Any] = {}


def _proto_class(t: int):
    if _PROTOS:
        return _PROTOS[t]
    _PROTOS.update({
        MsgType.Insert: msg_pb2.InsertRequest,
        MsgType.Delete: msg_pb2.DeleteRequest,
        MsgType.TimeTick: msg_pb2.TimeTickMsg,
        MsgType.CreateCollection: msg_pb2.CreateCollectionRequest,
        MsgType.DropCollection: msg_pb2.DropCollectionRequest,
        MsgType.CreatePartition: msg_pb2.CreatePartitionRequest,
        MsgType.DropPartition: msg_pb2.DropPartitionRequest,
    })
    return _PROTOS[t]


def _type_names() -> dict[str, int]:
    return {v.name: v.number for v in common_pb2.MsgType.DESCRIPTOR.values}


_NAMES: dict[str, int] | None = None


def msg_type_name(t: int) -> str:
    try:
        return common_pb2.MsgType.Name(int(t))
    except ValueError:
        return str(int(t))


def header_msg_type(payload: bytes) -> int:
    """``base.msg_type`` read straight from the bytes (field 1 must come first, as Go and
    Python serializers emit it), without parsing the rest of a possibly large payload."""
    if not payload or payload[0] != 0x0A:
        raise ValueError("payload does not start with a MsgBase header (field 1)")
    length, i = read_varint(payload, 1)
    end = i + length
    if end > len(payload):
        raise ValueError("MsgBase header runs past the payload")
    for field_no, wire, value, _ in iter_fields(payload, i, end):
        if field_no == 1 and wire == 0:
            return value
    return 0


def peek_msg_type(payload: bytes, properties: Mapping[str, str] | None = None) -> int:
    """The message type from the ``msg_type`` property, else from the payload header."""
    global _NAMES
    if properties:
        name = properties.get(MSG_TYPE_KEY)
        if name:
            if _NAMES is None:
                _NAMES = _type_names()
            t = _NAMES.get(name)
            if t is not None:
                return t
    try:
        return header_msg_type(payload)
    except ValueError as exc:
        raise DecodeError(f"cannot read the message type: {exc}", payload=payload) from exc


def marshal(msg: TsMsg) -> tuple[bytes, dict[str, str]]:
    """Payload bytes and properties, as Milvus 2.5's Produce writes them."""
    return msg.proto.SerializeToString(), {MSG_TYPE_KEY: msg_type_name(msg.msg_type)}


def unmarshal(payload: bytes, properties: Mapping[str, str] | None = None, *, channel: str | None = None,
              msg_id: bytes | None = None, float_views: bool = False) -> TsMsg:
    """Decode one MQ message into its TsMsg.

    Raises DecodeError (with channel, position and raw payload) for empty or malformed
    payloads and inconsistent row counts, and UnknownMessageTypeError for types this
    library does not decode and for Milvus 2.6 streaming-WAL messages (``_v`` property),
    which the classic msgstream skips too.

    ``float_views``: an Insert's top-level float vectors are not parsed by protobuf but viewed in ``payload``
    (:mod:`~msgstream_spark.msg.vecview`): the message's ``float_views`` hold them per ``fields_data`` index and
    those FieldData's ``float_vector`` is empty. For readers that convert through :meth:`InsertMsg.field_arrays`.
    """
    props = properties or {}
    if not payload:
        raise DecodeError("empty payload", channel=channel, msg_id=msg_id, payload=payload)
    if WAL_VERSION_KEY in props and props[WAL_VERSION_KEY] not in ("", "0"):
        raise UnknownMessageTypeError(
            f"Milvus 2.6 streaming-service message (_v={props[WAL_VERSION_KEY]}) is not a classic msgstream "
            "message", channel=channel, msg_id=msg_id, payload=payload)
    try:
        t = peek_msg_type(payload, props)
    except DecodeError as exc:
        raise exc.with_location(channel, msg_id) from exc.__cause__
    cls = _CLASSES.get(t)
    if cls is None:
        raise UnknownMessageTypeError(f"message type {msg_type_name(t)} ({t}) is not decoded by this library",
                                      channel=channel, msg_id=msg_id, payload=payload)
    proto = _proto_class(t)()
    viewed = float_views and t == MsgType.Insert and type(payload) is bytes  # bytes: immutable, safe to view
    split = vecview.split_float_vectors(payload) if viewed else None
    try:
        proto.ParseFromString(payload if split is None else split[0])
    except (PbDecodeError, ValueError, RuntimeError) as exc:
        raise DecodeError(f"malformed {msg_type_name(t)} payload: {exc}", channel=channel, msg_id=msg_id,
                          payload=payload) from exc
    header = int(proto.base.msg_type)
    if header != t:
        raise DecodeError(f"the msg_type property says {msg_type_name(t)} but the payload's header says "
                          f"{msg_type_name(header)} ({header})", channel=channel, msg_id=msg_id, payload=payload)
    if split is not None and any(int(proto.fields_data[k].type) != FLOAT_VECTOR for k in split[1]):
        proto = _proto_class(t)()  # float data under another type: the whole parse, whose checks report it
        proto.ParseFromString(payload)
        split = None
    msg = cls(proto, properties=props)
    if split is not None:
        msg.float_views = vecview.float_views(payload, split[1])
    if t == MsgType.Insert:
        _check_insert(proto, channel, msg_id, payload, msg.float_views)
    elif t == MsgType.Delete:
        _fix_delete(proto, channel, msg_id, payload)
    return msg


def _check_insert(req, channel, msg_id, payload, views=None) -> None:
    n = int(req.num_rows)
    if len(req.timestamps) != n or len(req.rowIDs) != n:
        raise DecodeError(
            f"inconsistent Insert: num_rows={n}, timestamps={len(req.timestamps)}, rowIDs={len(req.rowIDs)}",
            channel=channel, msg_id=msg_id, payload=payload)
    if req.version != 1 and len(req.row_data):
        raise DecodeError("row-based (legacy 2.0) Insert messages are not supported", channel=channel,
                          msg_id=msg_id, payload=payload)
    for k, fd in enumerate(req.fields_data):
        if not is_known_type(int(fd.type)):
            raise DecodeError(f"Insert field {fd.field_name!r} (id {fd.field_id}) has Milvus data type "
                              f"{type_name(fd.type)} ({int(fd.type)}), which this version does not decode",
                              channel=channel, msg_id=msg_id, payload=payload)
        if not len(fd.valid_data) and field_level_validity(fd):
            raise DecodeError(f"Insert field {fd.field_name!r} (id {fd.field_id}) carries its validity in "
                              "ScalarField/VectorField valid_data (newer than Milvus 3.0), which this version does "
                              "not read", channel=channel, msg_id=msg_id, payload=payload)
        rows = field_data_rows(fd, None if views is None or k not in views else views[k].size)
        if rows < 0:
            raise DecodeError(f"inconsistent Insert: field {fd.field_name!r} (type {fd.type}, dim {fd.vectors.dim}) "
                              "does not hold a whole number of rows", channel=channel, msg_id=msg_id, payload=payload)
        if rows != n:
            raise DecodeError(f"inconsistent Insert: field {fd.field_name!r} has {rows} rows, num_rows={n}",
                              channel=channel, msg_id=msg_id, payload=payload)


def _fix_delete(req, channel, msg_id, payload) -> None:
    if not req.HasField("primary_keys") and len(req.int64_primary_keys):
        req.primary_keys.int_id.data.extend(req.int64_primary_keys)
        req.num_rows = len(req.int64_primary_keys)
    ids = req.primary_keys
    which = ids.WhichOneof("id_field")
    npk = len(ids.int_id.data) if which == "int_id" else len(ids.str_id.data) if which == "str_id" else 0
    if not (int(req.num_rows) == len(req.timestamps) == npk):
        raise DecodeError(
            f"inconsistent Delete: num_rows={req.num_rows}, timestamps={len(req.timestamps)}, pks={npk}",
            channel=channel, msg_id=msg_id, payload=payload)
