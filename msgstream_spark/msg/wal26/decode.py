"""Decode Milvus 2.6 WAL messages into the same TsMsg objects a 2.5 topic gives (wal doc §2, §3).

Inserts and deletes are rebuilt as Milvus's own adaptor does: row timestamps := ``_tt``,
shard := ``_vc``, the insert's segment from the ``_h`` header (and its ``base.timestamp`` :=
``_tt``; a delete keeps its own). Other version-1 bodies decode to the 2.5 classes with
``base.timestamp`` := ``_tt``. Version-2 bodies and types newer than this library become a
:class:`WalMsg` that never fails to build. Every message carries its :class:`Envelope` as ``.wal``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

from msgstream_spark.errors import DecodeError
from msgstream_spark.msg import codec
from msgstream_spark.msg.pb import schema_pb2
from msgstream_spark.msg.position import MsgPosition
from msgstream_spark.msg.types import DeleteMsg, InsertMsg, TimeTickMsg, TsMsg
from msgstream_spark.msg.wal26 import fields
from msgstream_spark.msg.wal26.envelope import Envelope, parse_envelope, wire_version
from msgstream_spark.msg.wal26.headers import delete_collection, insert_route
from msgstream_spark.msg.wal26.ids import WalMessageId, position_of
from msgstream_spark.msg.wal26.types import V1_BODY_TYPES, WalMessageType, WALName

T = WalMessageType
# WAL type -> the 2.5 ``msg_type`` property name the classic codec decodes it by.
_V1_CLASSIC = {T.TimeTick: "TimeTick", T.Insert: "Insert", T.Delete: "Delete", T.CreateCollection: "CreateCollection",
               T.DropCollection: "DropCollection", T.CreatePartition: "CreatePartition",
               T.DropPartition: "DropPartition"}
_V1_PROPS = {t: {codec.MSG_TYPE_KEY: name} for t, name in _V1_CLASSIC.items()}  # read-only: the codec's view
_ALTER_BODY = {1: ("updates", {2: ("db_name", "string"), 3: ("collection_name", "string"), 5: ("schema", "bytes")})}


class WalMsg(TsMsg):
    """A WAL message without a 2.5 counterpart (DDL, maintenance, transaction control, newer types).

    Built from any payload without parsing it, so it never fails a read; ``header`` and
    ``schema`` decode on access.
    """

    msg_type = 0  # no commonpb.MsgType: use ``wal_type``

    def __init__(self, envelope: Envelope, payload: bytes, properties: Mapping[str, str] | None = None, *,
                 position: MsgPosition | None = None) -> None:
        super().__init__(None, properties=properties, position=position)
        self.wal = envelope
        self.body = bytes(payload)

    @property
    def wal_type(self) -> int:
        return self.wal.msg_type

    @property
    def base_msg_id(self) -> int:
        return 0

    @property
    def timestamp(self) -> int:
        return self.wal.time_tick

    @property
    def header(self) -> dict[str, Any] | None:
        """The ``_h`` header as a dict (None for types without a field table)."""
        return self.wal.header_fields

    @property
    def collection_id(self) -> int:
        try:
            return int((self.header or {}).get("collection_id", 0) or 0)
        except DecodeError:
            return 0

    @property
    def schema(self):
        """The new ``CollectionSchema`` of an AlterCollection / SchemaChange body, else None."""
        try:
            if self.wal.msg_type == T.AlterCollection:
                updates = fields.decode(_ALTER_BODY, self.body)["updates"] or {}
                raw = updates.get("schema", b"")
            elif self.wal.msg_type == T.SchemaChange:
                raw = fields.decode({1: ("schema", "bytes")}, self.body)["schema"]
            else:
                return None
        except ValueError as exc:
            raise DecodeError(f"malformed {self.wal.type_name} body: {exc}", payload=self.body) from None
        if not raw:
            return None
        s = schema_pb2.CollectionSchema()
        s.ParseFromString(raw)
        return s

    def __repr__(self) -> str:
        return f"WalMsg({self.wal.type_name}, tt={self.wal.time_tick}, vchannel={self.wal.vchannel})"


def decode_message(payload: bytes, properties: Mapping[str, str] | None = None, *, channel: str | None = None,
                   msg_id: bytes | None = None, float_views: bool = False) -> TsMsg:
    """One reader for both formats: no ``_v`` -> the 2.5 codec, ``_v`` 1/2 -> :func:`decode_wal`. ``float_views``:
    as :func:`~msgstream_spark.msg.codec.unmarshal`'s."""
    try:
        version = wire_version(properties)
    except DecodeError as exc:
        raise exc.with_location(channel, msg_id) from None
    if version == 0:
        return codec.unmarshal(payload, properties, channel=channel, msg_id=msg_id, float_views=float_views)
    return decode_wal(payload, properties or {}, channel=channel, msg_id=msg_id, float_views=float_views)


def decode_wal(payload: bytes, properties: Mapping[str, str], *, channel: str | None = None,
               msg_id: bytes | None = None, float_views: bool = False) -> TsMsg:
    """Decode one WAL message (``_v`` 1 or 2). DecodeError names channel and position."""
    env = parse_envelope(properties, channel=channel, msg_id=msg_id)
    if env.cipher is not None:
        raise DecodeError(
            f"encrypted {env.type_name} message on vchannel {env.vchannel} (_ch: encryption zone {env.cipher.ez_id}, "
            f"collection {env.cipher.collection_id}): its payload needs Milvus's KMS plugin and cannot be decoded",
            channel=channel, msg_id=msg_id, payload=payload)
    if env.version != 1 or env.msg_type not in _V1_CLASSIC:
        return WalMsg(env, payload, properties)
    if env.msg_type == T.TimeTick and not payload:
        msg: TsMsg = TimeTickMsg.build(env.time_tick)
    else:
        msg = codec.unmarshal(payload, _V1_PROPS[env.msg_type], channel=channel, msg_id=msg_id,
                              float_views=float_views)
    try:
        _rebuild(msg, env)
    except DecodeError as exc:
        raise exc.with_location(channel, msg_id) from exc.__cause__
    msg.properties = dict(properties)
    msg.wal = env
    return msg


def _rebuild(msg: TsMsg, env: Envelope) -> None:
    """Apply the properties to a version-1 body, as Milvus's adaptor does."""
    if isinstance(msg, InsertMsg):
        _rebuild_insert(msg, env)
    elif isinstance(msg, DeleteMsg):
        _rebuild_delete(msg, env)
    else:
        msg.proto.base.timestamp = env.time_tick


def _header(env: Envelope, parse):
    try:
        return parse(env.header)
    except ValueError as exc:
        raise DecodeError(f"malformed _h header of a {env.type_name} message: {exc}") from None


def _check_collection(kind: str, header_id: int, body_id: int, env: Envelope) -> None:
    """The ``_h`` header and the body must name the same collection."""
    if header_id != body_id:
        raise DecodeError(f"{kind} on vchannel {env.vchannel}: _h names collection {header_id}, "
                          f"the body collection {body_id}")


def _rebuild_insert(msg: InsertMsg, env: Envelope) -> None:
    req = msg.proto
    cid, segments = _header(env, insert_route)
    _check_collection("Insert", cid, req.collectionID, env)
    pid = req.partitionID
    segment = segments.get(pid, 0)
    if segment == 0:
        raise DecodeError(f"Insert on vchannel {env.vchannel}: _h assigns no segment to partition "
                          f"{pid} (Milvus treats this message as corrupt)")
    req.segmentID = segment
    _set_row_times(req, env.time_tick, int(req.num_rows))
    req.base.timestamp = env.time_tick
    req.shardName = env.vchannel or ""


def _rebuild_delete(msg: DeleteMsg, env: Envelope) -> None:
    req = msg.proto
    _check_collection("Delete", _header(env, delete_collection), req.collectionID, env)
    _set_row_times(req, env.time_tick, len(req.timestamps))
    req.shardName = env.vchannel or ""


def _set_row_times(req: Any, tt: int, n: int) -> None:
    del req.timestamps[:]
    req.timestamps.extend([int(tt)] * n)


def time_tick_of(msg: TsMsg) -> int:
    """The time tick Milvus orders a message by: ``_tt`` for a WAL message, the body's BeginTs for 2.5."""
    return msg.wal.time_tick if msg.wal is not None else msg.begin_ts


def vchannel_of(msg: TsMsg) -> str | None:
    """The vchannel of a message: ``_vc`` (None: every vchannel), or a 2.5 body's shard name."""
    if msg.wal is not None:
        return msg.wal.vchannel
    return getattr(msg.proto, "shardName", None) or None


def with_time_tick(msg: TsMsg, commit: Envelope, position: MsgPosition | None = None) -> TsMsg:
    """A transaction body as released by its commit: the commit's time tick and last-confirmed id.

    Rewrites the row timestamps (and an insert's or another V1 body's ``base.timestamp``) like
    decoding would have with the commit's ``_tt``; the position becomes ``position`` when given.
    """
    env = msg.wal
    if env is None:
        raise ValueError("with_time_tick applies to WAL messages only")
    new_env = dataclasses.replace(env, time_tick=commit.time_tick, last_confirmed=commit.last_confirmed,
                                  last_confirmed_self=commit.last_confirmed_self)
    if isinstance(msg, (InsertMsg, DeleteMsg)):
        _set_row_times(msg.proto, commit.time_tick, len(msg.proto.timestamps))
    if not isinstance(msg, (WalMsg, DeleteMsg)):
        msg.proto.base.timestamp = commit.time_tick
    msg.wal = new_env
    if position is not None:
        msg.position = dataclasses.replace(position, channel_name=env.vchannel or position.channel_name)
    return msg


def wal_position(env: Envelope, wal: WALName, own_id: WalMessageId | None = None) -> MsgPosition | None:
    """The ``msgpb.MsgPosition`` of a WAL message: ``_lc`` (or the own id with ``_lcs``) in legacy bytes.

    None when the message carries neither (e.g. a replicated message whose source ids were stripped).
    """
    if env.last_confirmed_self:
        last = own_id
    elif env.last_confirmed:
        last = WalMessageId(wal, env.last_confirmed)
    else:
        last = None
    if last is None:
        return None
    return position_of(vchannel=env.vchannel or "", time_tick=env.time_tick, last_confirmed=last)


__all__ = ["V1_BODY_TYPES", "WalMsg", "decode_message", "decode_wal", "time_tick_of", "vchannel_of", "wal_position",
           "with_time_tick"]
