"""Milvus 2.6 start positions: a ``streaming.WALCheckpoint`` or a ``common.MessageID`` per channel.

Both become the equivalent ``msgpb.MsgPosition`` (legacy id bytes), so they resume as Milvus
does: AT the id, skipping what has a time tick at or below the checkpoint's (a MessageID has
none: everything from the id on). The forms are told apart by their protobuf shape: a
MsgPosition has ``msgID`` (field 2) as bytes, a WALCheckpoint nests a MessageID in field 1
(which starts with that MessageID's tag byte ``0x0a``), a MessageID has a text id in field 1
and a varint WAL name in field 2.
"""

from __future__ import annotations

import base64
import binascii
from typing import Any

from msgstream_spark.errors import ConfigError, DecodeError, OptionError
from msgstream_spark.msg.position import MsgPosition
from msgstream_spark.msg.wal26 import WalCheckpoint, WalMessageId
from msgstream_spark.msg.wire import iter_fields
from msgstream_spark.stream.walstart import resume_position


def _shape(raw: bytes) -> str | None:
    """``checkpoint``, ``message_id`` or None (a MsgPosition, or not a protobuf at all)."""
    try:
        fields = [(num, wire, value, start) for num, wire, value, start in iter_fields(raw)]
    except (IndexError, ValueError):
        return None
    kinds = {num: wire for num, wire, _, _ in fields}
    if kinds.get(2) == 2 or kinds.get(1) != 2:
        return None
    _, _, length, start = next(f for f in fields if f[0] == 1)
    first = raw[start:start + length]
    if first[:1] == b"\x0a":
        return "checkpoint"
    if set(kinds) <= {1, 2} and all(0x20 <= b < 0x7F for b in first):
        return "message_id"
    return None


def parse_wal_start(value: Any) -> WalCheckpoint | WalMessageId | None:
    """A WAL checkpoint / message id given as JSON ``{"id", "wal_name"}`` or base64; None otherwise."""
    if isinstance(value, dict):
        return WalMessageId.from_dict(value) if "id" in value else None
    if not isinstance(value, str):
        return None
    try:
        raw = base64.b64decode(value.strip(), validate=True)
    except (binascii.Error, ValueError):
        return None
    shape = _shape(raw)
    if shape == "checkpoint":
        return WalCheckpoint.from_proto_bytes(raw)
    if shape == "message_id":
        return WalMessageId.from_proto_bytes(raw)
    return None


def wal_start_position(channel: str, value: Any, backend: str) -> MsgPosition | None:
    """The MsgPosition a WAL checkpoint / message id of ``channel`` stands for; None if ``value`` is neither.

    The conversion is the stream layer's (:func:`msgstream_spark.stream.walstart.resume_position`);
    OptionError when the id belongs to another WAL than the backend read, or has no usable id.
    """
    try:
        start = parse_wal_start(value)
        return None if start is None else resume_position(channel, start, backend=backend)
    except (ValueError, DecodeError, ConfigError) as exc:
        reason = exc.reason if isinstance(exc, DecodeError) else str(exc)
        raise OptionError(f"startingPositions: the WAL checkpoint or message id of channel {channel}: "
                          f"{reason}") from None
