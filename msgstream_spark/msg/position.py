"""MsgPosition: (channel, backend msgID bytes, msgGroup, hybrid ts) — Milvus's checkpoint record.

Convertible to and from the ``msgpb.MsgPosition`` protobuf bytes (as Milvus keeps channel
checkpoints in etcd), base64 of those bytes, and a JSON form used in Spark offsets.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass
from typing import Any

from google.protobuf.message import DecodeError as PbDecodeError

from msgstream_spark.msg.pb import msg_pb2


@dataclass(frozen=True)
class MsgPosition:
    channel_name: str
    msg_id: bytes
    msg_group: str = ""
    timestamp: int = 0
    wal_name: int = 0

    # -- protobuf ----------------------------------------------------------------------
    def to_proto(self):
        return msg_pb2.MsgPosition(channel_name=self.channel_name, msgID=self.msg_id,
                                   msgGroup=self.msg_group, timestamp=self.timestamp,
                                   WAL_name=self.wal_name)

    def to_proto_bytes(self) -> bytes:
        return self.to_proto().SerializeToString()

    @classmethod
    def from_proto(cls, p: Any) -> MsgPosition:
        return cls(p.channel_name, bytes(p.msgID), p.msgGroup, int(p.timestamp), int(p.WAL_name))

    @classmethod
    def from_proto_bytes(cls, data: bytes) -> MsgPosition:
        p = msg_pb2.MsgPosition()
        try:
            p.ParseFromString(data)
        except PbDecodeError as exc:
            raise ValueError(f"not a msgpb.MsgPosition protobuf ({len(data)} bytes): {exc}") from exc
        if not p.channel_name:
            raise ValueError("MsgPosition protobuf has no channel_name")
        return cls.from_proto(p)

    def to_base64(self) -> str:
        return base64.b64encode(self.to_proto_bytes()).decode("ascii")

    @classmethod
    def from_base64(cls, text: str) -> MsgPosition:
        try:
            raw = base64.b64decode(text.strip(), validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ValueError(f"position is not valid base64: {text[:40]!r}") from exc
        return cls.from_proto_bytes(raw)

    # -- JSON ------------------------------------------------------------------------------
    def to_json_dict(self) -> dict[str, Any]:
        d = {"channel_name": self.channel_name,
             "msgID": base64.b64encode(self.msg_id).decode("ascii"),
             "msgGroup": self.msg_group, "timestamp": int(self.timestamp)}
        if self.wal_name:  # a Milvus 2.6 position (msgID = a last-confirmed id to start AT)
            d["WAL_name"] = int(self.wal_name)
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_json_dict(), sort_keys=True)

    @classmethod
    def from_json_dict(cls, d: dict[str, Any], channel: str | None = None) -> MsgPosition:
        if not isinstance(d, dict):
            raise ValueError(f"position must be a JSON object, got {type(d).__name__}")
        ch = d.get("channel_name", d.get("channel", channel))
        if not ch:
            raise ValueError(f"position {d} names no channel (key channel_name)")
        mid = d.get("msgID", d.get("msg_id", ""))
        try:
            msg_id = base64.b64decode(mid, validate=True) if mid else b""
        except (binascii.Error, ValueError) as exc:
            raise ValueError(f"position of channel {ch}: msgID is not valid base64: {mid!r}") from exc
        try:
            ts = int(d.get("timestamp", d.get("ts", 0)) or 0)
        except (TypeError, ValueError):
            raise ValueError(f"position of channel {ch}: timestamp must be an integer") from None
        try:
            wal = int(d.get("WAL_name", d.get("wal_name", 0)) or 0)
        except (TypeError, ValueError):
            raise ValueError(f"position of channel {ch}: WAL_name must be an integer") from None
        return cls(str(ch), msg_id, str(d.get("msgGroup", d.get("msg_group", "")) or ""), ts, wal)

    @classmethod
    def parse(cls, text: str) -> MsgPosition:
        """A JSON object or base64 of a ``msgpb.MsgPosition`` protobuf."""
        t = text.strip()
        if t.startswith("{"):
            try:
                return cls.from_json_dict(json.loads(t))
            except json.JSONDecodeError as exc:
                raise ValueError(f"position is not valid JSON: {exc}") from exc
        return cls.from_base64(t)


def parse_positions(text: str) -> list[MsgPosition]:
    """A JSON list, a JSON map {channel: position-or-base64}, or comma-separated base64 protobufs."""
    t = text.strip()
    if not t:
        raise ValueError("empty position list")
    if t[0] in "[{":
        try:
            data = json.loads(t)
        except json.JSONDecodeError as exc:
            raise ValueError(f"positions are not valid JSON: {exc}") from exc
        if isinstance(data, list):
            return [MsgPosition.from_json_dict(d) if isinstance(d, dict) else MsgPosition.from_base64(str(d))
                    for d in data]
        if "channel_name" in data or "msgID" in data:
            return [MsgPosition.from_json_dict(data)]
        out = []
        for ch, v in data.items():
            p = MsgPosition.from_base64(v) if isinstance(v, str) else MsgPosition.from_json_dict(v, ch)
            out.append(p)
        return out
    return [MsgPosition.from_base64(part) for part in t.split(",") if part.strip()]
