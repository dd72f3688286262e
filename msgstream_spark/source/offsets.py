"""Spark offsets of the msgstream source and how start/end positions resolve to them.

An offset is ``{channel: {"msgID": base64, "ts": hybrid ts}}`` with sorted keys (Spark
compares offsets as JSON strings). ``msgID`` is the id of the last message a batch
included; the next batch starts after it (start exclusive, end inclusive). ``""`` means
"nothing read yet: from the start of the channel". Two flags appear only where users
give positions:

* ``"inclusive": true`` on a start: Milvus's seek semantics (wire doc §7.5) — start AT
  ``msgID`` and drop messages with BeginTs <= ``ts`` until the first time tick >= ``ts``.
  Milvus channel checkpoints and this source's ``_position`` column resume this way.
* ``"exclusive": true`` on an end: the end is a position (``endingPositions``, ``endingTimestamp``): the
  range holds what a resume from ``msgID`` and ``ts`` would *not* read (:class:`~msgstream_spark.stream.seek.
  EndFilter`): everything before ``msgID``, then what has a time at or below ``ts`` up to the first time
  tick at or after it (a 2.6 WAL's broker order is not time order). ``"upTo"`` (base64) is the channel's
  last message when the read was planned: the read stops there at the latest.

The source itself adds ``"atTick": true`` to an end that is a time tick, so the next batches of
that channel stay tick-aligned even before the scan meets another tick. A message with a time
(``ts`` > 0: every 2.6 message, every 2.5 insert) is not a tick: the read-only ``milvus`` backend
never delivers ticks to the source's scans (``DumpMessages`` filters them), so taking any timed
end for a tick made a restarted query wait forever for one (issue #19).
"""

from __future__ import annotations

import base64
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from msgstream_spark.errors import DataLossError, OptionError
from msgstream_spark.msg.position import MsgPosition, parse_positions
from msgstream_spark.source.walpos import wal_start_position
from msgstream_spark.stream.names import to_physical_channel
from msgstream_spark.stream.timeseek import first_after, first_at_or_after

log = logging.getLogger(__name__)

Entry = dict[str, Any]
Offset = dict[str, Entry]


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii") if data else ""


def unb64(text: str) -> bytes:
    return base64.b64decode(text) if text else b""


def entry(msg_id: bytes, ts: int, **flags: bool) -> Entry:
    e: Entry = {"msgID": b64(msg_id), "ts": int(ts)}
    e.update({k: True for k, v in flags.items() if v})
    return e


def dumps(offset: Offset) -> str:
    return json.dumps(offset, sort_keys=True)


def normalize(offset: Offset) -> Offset:
    """Sorted keys at both levels (JSON string equality is what Spark compares)."""
    return json.loads(dumps(offset))


def parse_json_positions(text: str, channels: list[str], backend: str = "?") -> dict[str, Any]:
    """{channel: "earliest" | "latest" | MsgPosition} from the JSON/base64 forms.

    In a JSON map, a channel's value may also be a Milvus 2.6 ``streaming.WALCheckpoint`` (base64)
    or ``common.MessageID`` (JSON ``{"id", "wal_name"}`` or base64): see :mod:`.walpos`.
    """
    t = text.strip()
    out: dict[str, Any] = {}
    if t.startswith("{"):
        try:
            data = json.loads(t)
        except json.JSONDecodeError as exc:
            raise OptionError(f"positions are not valid JSON: {exc}") from None
        if isinstance(data, dict) and not ("channel_name" in data or "msgID" in data):
            rest = {}
            for ch, v in data.items():
                if isinstance(v, str) and v.strip().lower() in ("earliest", "latest"):
                    out[to_physical_channel(ch)] = v.strip().lower()
                elif (wal := wal_start_position(to_physical_channel(ch), v, backend)) is not None:
                    out[to_physical_channel(ch)] = wal
                else:
                    rest[ch] = v
            t = json.dumps(rest) if rest else ""
    if t:
        try:
            for p in parse_positions(t):
                out[to_physical_channel(p.channel_name)] = p
        except ValueError as exc:
            raise OptionError(f"bad position: {exc}") from None
    unknown = sorted(set(out) - set(channels))
    if unknown:
        raise OptionError(f"positions name channel(s) {', '.join(unknown)} that are not read "
                          f"(channels: {', '.join(channels)})")
    return out


def resolve_start(client: Any, channels: list[str], spec: str | None, starting_ts: int | None,
                  fail_on_data_loss: bool, subscription: str = "") -> Offset:
    """The initial offset for ``channels`` from startingPositions / startingTimestamp."""
    out: Offset = {}
    per: dict[str, Any] = {}
    default = "earliest"
    if spec and spec.strip().lower() in ("earliest", "latest"):
        default = spec.strip().lower()
    elif spec:
        per = parse_json_positions(spec, channels, getattr(client, "name", "?"))
        missing = [c for c in channels if c not in per]
        if missing:
            raise OptionError(f"option startingPositions must cover every channel; missing: {', '.join(missing)}")
    for ch in channels:
        how = per.get(ch, default)
        if starting_ts is not None:
            mid = first_at_or_after(client, ch, starting_ts)  # by the messages' own times
            if mid is None:
                latest = client.latest_message_id(ch)
                out[ch] = entry(latest.serialize() if latest else b"", starting_ts)
            else:
                out[ch] = entry(mid.serialize(), max(0, starting_ts - 1), inclusive=True)
        elif how == "earliest":
            out[ch] = entry(b"", 0)
        elif how == "latest":
            latest = client.latest_message_id(ch)
            out[ch] = entry(latest.serialize() if latest else b"", 0)
        else:
            pos: MsgPosition = how
            if not pos.msg_id:
                raise OptionError(f"startingPositions: the position of channel {ch} has an empty msgID")
            mid = client.bytes_to_message_id(pos.msg_id)
            first = client.first_message_id(ch)
            if first is not None and mid < first and not mid.at_earliest_position():
                msg = (f"channel {ch}: start position {b64(pos.msg_id)} was removed by retention "
                       f"(first retained message: {b64(first.serialize())})")
                if fail_on_data_loss:
                    raise DataLossError(msg + "; set failOnDataLoss=false to start at the first retained message",
                                        channel=ch)
                log.warning("%s; starting at the first retained message (failOnDataLoss=false)", msg)
                out[ch] = entry(first.serialize(), 0, inclusive=True)
                continue
            out[ch] = entry(pos.msg_id, pos.timestamp, inclusive=True)
    return normalize(out)


def resolve_end(client: Any, channels: list[str], spec: str | None, ending_ts: int | None) -> Offset:
    """The end offset of a batch read from endingPositions / endingTimestamp (default latest)."""
    out: Offset = {}
    per: dict[str, Any] = {}
    if spec and spec.strip().lower() == "earliest":
        raise OptionError("option endingPositions=earliest is not allowed (nothing to read)")
    if spec and spec.strip().lower() != "latest":
        per = parse_json_positions(spec, channels, getattr(client, "name", "?"))
    for ch in channels:
        how = per.get(ch, "latest")
        if ending_ts is not None:
            mid = first_after(client, ch, ending_ts)  # by the messages' own times
            if mid is not None:
                out[ch] = _position_end(client, ch, mid.serialize(), ending_ts)
                continue
            how = "latest"
        if how == "latest":
            latest = client.latest_message_id(ch)
            out[ch] = entry(latest.serialize() if latest else b"", 0)
        elif how == "earliest":
            raise OptionError(f"endingPositions: earliest is not a valid end (channel {ch})")
        else:
            out[ch] = _position_end(client, ch, how.msg_id, how.timestamp)
    return normalize(out)


def _position_end(client: Any, channel: str, msg_id: bytes, ts: int) -> Entry:
    """An end at a position: ``exclusive``, bounded by the channel's last message now (``upTo``)."""
    e = entry(msg_id, ts, exclusive=True)
    latest = client.latest_message_id(channel)
    if latest is not None:
        e["upTo"] = b64(latest.serialize())
    return e


@dataclass(frozen=True)
class ChannelOffset:
    """One channel's entry of a Spark offset, typed: the msgID bytes, the hybrid ts and the flags.

    Round-trips exactly to the JSON entry Spark stores (``to_json``/``from_json``).
    """

    msg_id: bytes = b""
    ts: int = 0
    inclusive: bool = False  # a start AT msg_id, with Milvus's seek filter on ts
    exclusive: bool = False  # an end at a position (msg_id, ts): what a resume from it would not read
    at_tick: bool = False  # an end at a time tick (the next batch stays tick-aligned)
    up_to: bytes = b""  # a position end: the channel's last message when planned (the read stops there)

    @classmethod
    def from_json(cls, e: Mapping[str, Any]) -> ChannelOffset:
        return cls(unb64(e.get("msgID", "")), int(e.get("ts", 0)), bool(e.get("inclusive")),
                   bool(e.get("exclusive")), bool(e.get("atTick")), unb64(e.get("upTo", "")))

    def to_json(self) -> Entry:
        e = entry(self.msg_id, self.ts, inclusive=self.inclusive, exclusive=self.exclusive, atTick=self.at_tick)
        if self.up_to:
            e["upTo"] = b64(self.up_to)
        return e
