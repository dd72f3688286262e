"""Milvus time of a message, and seeks by time that trust the message, not the broker's clock.

A message's time is what Milvus put in it (:func:`message_time`): for 2.5 the BeginTs of the
body (the lowest row timestamp of an Insert/Delete, ``base.timestamp`` of every other type,
a TimeTick's own ts), for 2.6 the ``_tt`` property. The broker's record/publish time is only
a guess: Milvus 2.3.5 on Kafka stamps records 14-61 ms after the physical part of the hybrid
ts, a producer may stamp zero, and clocks may be hours apart.

:func:`first_at_or_after` asks the broker's time index (``Client.message_id_at_timestamp``)
for a *coarse* start ``MARGIN_MS`` before the wanted time and then checks it against the
messages: the start is used only when the first message there with a known Milvus time is
older than the wanted time, so everything wanted lies after it. Otherwise the margin grows
(x16 each step) and, after ``GALLOPS`` tries, the search starts at the beginning of the
channel. From that start a forward scan walks the payload headers (no full decode) to the
first message whose Milvus time reaches the wanted time. Correctness does not depend on the
margin or on the broker's clock — a lying index only makes the scan longer; the margin just
makes the usual case (producer and broker clocks within seconds) one probe plus a short scan.

The search assumes what Milvus guarantees per physical channel: message times do not go
backwards (the rootcoord allocates them in order and writes a channel's DML before the time
tick that covers it). Messages whose time cannot be read (undecodable payloads) are passed
over by the search and stay inside the range that contains them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping

from msgstream_spark.errors import BackendTimeoutError, DecodeError
from msgstream_spark.mq.base import Client, Consumer, MessageID
from msgstream_spark.msg import codec
from msgstream_spark.msg.codec import iter_fields, read_varint
from msgstream_spark.msg.types import MsgType
from msgstream_spark.msg.wal26 import is_wal_message

log = logging.getLogger(__name__)

MARGIN_MS = 5_000  # first probe of the broker's index: 5 s before the wanted time
GALLOP = 16  # each failed probe moves 16 times further back (5 s, 80 s, 21 min, 5.7 h)
GALLOPS = 4  # then the search starts at the beginning of the channel
STALL_TIMEOUT = 30.0  # seconds without a message while the scan has not reached the last id
_BATCH = 256

_ROW_TS_FIELD = 10  # InsertRequest.timestamps and DeleteRequest.timestamps (packed uint64)
_TT_KEY = "_tt"  # 2.6 WAL: the message's time tick, base 36
_WAL_TICK = "1"  # ``_t`` of a 2.6 TimeTick


def message_time(payload: bytes, properties: Mapping[str, str] | None = None) -> int | None:
    """The Milvus hybrid time of one message, or None when it cannot be read.

    The one place that says when a message happened: seeks, the CLI and the Spark source all
    ask here, never the broker's record time. 2.6 WAL messages carry it in ``_tt``; 2.5 bodies
    as BeginTs (wire doc §6.1).
    """
    if properties:
        tt = properties.get(_TT_KEY)
        if tt:
            try:
                return int(tt, 36)
            except ValueError:
                return None
    try:
        t = codec.peek_msg_type(payload, properties)
    except DecodeError:
        return None
    try:
        return _begin_ts(payload, t)
    except (IndexError, ValueError):
        return None


def tick_and_time(payload: bytes, properties: Mapping[str, str] | None = None) -> tuple[bool, int | None]:
    """(whether the message is a time tick for every vchannel, its Milvus time as :func:`message_time`).

    2.6: a TimeTick (``_t`` 1) without ``_vc``; 2.5 (version 0 too): the body's type. No full decode.
    """
    if is_wal_message(properties):
        tick = properties.get("_t") == _WAL_TICK and not properties.get("_vc")
        return tick, message_time(payload, properties)
    try:
        tick = codec.peek_msg_type(payload, properties) == MsgType.TimeTick
    except DecodeError:
        tick = False
    return tick, message_time(payload, properties)


def _begin_ts(payload: bytes, msg_type: int) -> int | None:
    """BeginTs by a walk over top-level fields: min row timestamp, else ``base.timestamp``."""
    base_ts = None
    row_min = None
    want_rows = msg_type in (MsgType.Insert, MsgType.Delete)
    for fno, wire, value, start in iter_fields(payload):
        if fno == 1 and wire == 2:
            for f2, w2, v2, _ in iter_fields(payload, start, start + value):
                if f2 == 3 and w2 == 0:
                    base_ts = v2
        elif want_rows and fno == _ROW_TS_FIELD:
            if wire == 2:  # packed
                i, end = start, start + value
                while i < end:
                    v, i = read_varint(payload, i)
                    row_min = v if row_min is None or v < row_min else row_min
            elif wire == 0:
                row_min = value if row_min is None or value < row_min else row_min
    if row_min is not None:
        return row_min
    return base_ts if base_ts else None


def first_at_or_after(client: Client, channel: str, ts: int, *,
                      stall_timeout: float = STALL_TIMEOUT) -> MessageID | None:
    """Id of the first message of ``channel`` whose Milvus time is >= ``ts``; None if none."""
    ts = int(ts)
    last = client.latest_message_id(channel)
    if last is None:
        return None
    reader = client.reader(channel)
    try:
        margin = MARGIN_MS
        first: list[MessageID | None] = []
        for _ in range(GALLOPS):
            probe = max(0, (ts >> 18) - margin) << 18
            cid = client.message_id_at_timestamp(channel, probe)  # the broker's clock: a guess
            if cid is not None:
                found, verified = _scan(reader, channel, cid, ts, last, stall_timeout)
                if verified:
                    return found
                if found == cid:  # wanted from cid on: right if cid is the channel's first message
                    first = first or [client.first_message_id(channel)]
                    if first[0] is not None and cid <= first[0]:
                        return cid
            if probe == 0:
                break
            margin *= GALLOP
        log.info("channel %s: the broker's time index disagrees with the messages' times near %d; "
                 "searching from the start of the channel", channel, ts)
        return _scan(reader, channel, client.earliest_message_id(), ts, last, stall_timeout)[0]
    finally:
        try:
            reader.unsubscribe()
        except Exception:  # noqa: BLE001 - a throwaway reader; the answer is already known
            log.warning("removing the time-seek reader of channel %s failed", channel, exc_info=True)


def first_after(client: Client, channel: str, ts: int, **kw: float) -> MessageID | None:
    """Id of the first message whose Milvus time is > ``ts`` (the exclusive end of ``<= ts``)."""
    return first_at_or_after(client, channel, int(ts) + 1, **kw)


def _batches(reader: Consumer, channel: str, start: MessageID, last: MessageID, stall_timeout: float):
    """Batches of messages from ``start`` (inclusive) to ``last``; raises if the channel stalls."""
    reader.seek(start, inclusive=True)
    deadline = time.monotonic() + stall_timeout
    while True:
        batch = reader.receive_batch(_BATCH, min(1.0, stall_timeout))
        if batch:
            deadline = time.monotonic() + stall_timeout
            yield batch
            if batch[-1].id >= last:
                return
        elif time.monotonic() > deadline:
            raise BackendTimeoutError(f"channel {channel}: no message arrived for {stall_timeout:g}s while "
                                      f"searching by time up to the last message {last!r}")


def _scan(reader: Consumer, channel: str, start: MessageID, ts: int, last: MessageID,
          stall_timeout: float) -> tuple[MessageID | None, bool]:
    """(first id at or after ``start`` with time >= ``ts``, whether ``start`` is a valid lower bound).

    ``start`` is a lower bound when the first message there with a known time is older than
    ``ts`` (or when it is the start of the channel): then nothing wanted lies before it.
    """
    checked = start.at_earliest_position()
    for batch in _batches(reader, channel, start, last, stall_timeout):
        for m in batch:
            t = message_time(m.payload, m.properties)
            if t is not None:
                if t >= ts:
                    return m.id, checked
                checked = True
            if m.id >= last:
                return None, checked
    return None, checked
