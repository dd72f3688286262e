"""TtMsgStream: packs cut at time ticks every channel has reached (wire doc §7.4-7.5).

Per consumed channel it keeps a buffer of decoded messages, the last time tick read and a
current position. A pack holds every non-TimeTick message with ``EndTs <= T``, where T is
a time tick all channels have reached; later messages stay buffered. End positions are
resumable: seeking to them (inclusive msgID, then dropping what is at or before the
timestamp) continues exactly after the pack.

Milvus 2.6 WAL messages (and a 2.5 -> 2.6 upgrade on one channel) are decoded by the channel's
:class:`~msgstream_spark.stream.decode.ChannelDecoder`: they are ordered and cut by their ``_tt``
(a transaction's bodies by their commit's, released at the commit), and a TimeTick without ``_vc``
counts for every vchannel of its pchannel. Within a pack, WAL messages of a channel are sorted by
``_tt`` as Milvus's consumer sorts them. A resume (``seek``) starts at the position's msgID and
drops what is at or before its timestamp: for 2.5 by Milvus's seek filter, for 2.6 by ``_tt``.

Difference from Milvus, on purpose: Milvus waits until every channel reports the *same*
tick (RootCoord broadcasts one tick to all channels). Channels written by independent
producers (our sink) carry different ticks, so after catching channels up to the
highest tick available we cut at the lowest one. With Milvus's uniform ticks both rules
give the same packs.
"""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field

from msgstream_spark.errors import ConfigError
from msgstream_spark.mq.base import Client, Message
from msgstream_spark.msg.position import MsgPosition
from msgstream_spark.msg.types import DeleteMsg, InsertMsg, MsgPack, MsgType, TsMsg
from msgstream_spark.stream.msgstream import MsgStream, RepackFunc
from msgstream_spark.stream.ticks import common_tick


@dataclass
class _ChannelState:
    buffer: list[TsMsg] = field(default_factory=list)
    pending: deque = field(default_factory=deque)  # raw messages read but not yet processed
    tt: int = 0  # last time tick read
    tt_position: MsgPosition | None = None
    current: MsgPosition | None = None


def order_ts(m: TsMsg) -> int:
    """The time a message is cut and ordered by: ``_tt`` for a WAL message, EndTs for a 2.5 one."""
    return m.wal.time_tick if m.wal is not None else int(m.end_ts)


def split_by_tick(msgs: list[TsMsg], t: int) -> tuple[list[TsMsg], list[TsMsg]]:
    """(messages up to tick ``t``, the rest); WAL messages of the first part sorted by ``_tt`` in place."""
    take = [m for m in msgs if order_ts(m) <= t]
    rest = [m for m in msgs if order_ts(m) > t]
    wal_at = [i for i, m in enumerate(take) if m.wal is not None]
    for i, m in zip(wal_at, sorted((take[i] for i in wal_at), key=order_ts)):
        take[i] = m
    return take, rest


class TtMsgStream(MsgStream):
    """A MsgStream whose consumer side yields time-tick aligned MsgPacks."""

    _seek_filters = True

    def __init__(self, client: Client, *, repack: RepackFunc | None = None,
                 on_decode_error: str = "fail", own_client: bool = True, dedupe: bool = True,
                 read_batch: int = 512) -> None:
        super().__init__(client, repack=repack, on_decode_error=on_decode_error, own_client=own_client)
        self.dedupe = dedupe
        self.read_batch = read_batch
        self._state: dict[str, _ChannelState] = {}
        self.last_end_ts = 0

    def _st(self, channel: str) -> _ChannelState:
        st = self._state.get(channel)
        if st is None:
            st = self._state[channel] = _ChannelState()
        return st

    def seek(self, positions: Sequence[MsgPosition], inclusive: bool = True) -> None:
        """Seek inclusively to each position's msgID, then skip what is at or before its ts.

        The ``inclusive`` flag is ignored, as in Milvus's time-tick stream.
        """
        super().seek(positions, inclusive=True)  # the channel decoders filter by the positions' timestamps
        for p in positions:
            ch = self._consumer_for(p.channel_name).channel
            st = self._st(ch)
            st.buffer.clear()
            st.pending.clear()
            st.tt = 0
            st.current = MsgPosition(ch, p.msg_id, self.subscription or "", p.timestamp)
        if positions:
            self.last_end_ts = min(p.timestamp for p in positions)

    # -- reading -----------------------------------------------------------------------
    def _process(self, ch: str, raw: Message) -> bool:
        """Handle one raw message of ``ch``; True when it released a time tick that counts."""
        st = self._st(ch)
        ticked = False
        for msg in self.decode_all(raw):
            if msg.msg_type != MsgType.TimeTick:
                st.buffer.append(msg)
            elif msg.wal is None or msg.wal.all_vchannels:  # a tick with _vc is for one vchannel only
                st.tt = int(msg.timestamp)
                st.tt_position = msg.position
                ticked = True
        return ticked

    def _read_until_tick(self, ch: str, min_tt: int, wait: float) -> None:
        """Read ``ch`` until it has a tick > ``min_tt`` or nothing more arrives in ``wait``."""
        st = self._st(ch)
        consumer = self._consumers[ch]
        deadline = time.monotonic() + wait
        while st.tt <= min_tt:
            if not st.pending:
                batch = consumer.receive_batch(self.read_batch, max(0.0, deadline - time.monotonic()))
                if not batch:
                    return
                st.pending.extend(batch)
            while st.pending and st.tt <= min_tt:
                raw = st.pending.popleft()
                consumer.ack(raw)
                self._process(ch, raw)

    def consume(self, timeout: float = 1.0) -> MsgPack | None:
        """The next time-tick aligned pack, or None when none is complete within ``timeout``."""
        if not self._consumers:
            raise ConfigError("this TtMsgStream has no consumers: call as_consumer(...) first")
        deadline = time.monotonic() + max(0.0, timeout)
        chans = self.consumer_channels
        while True:
            for ch in chans:
                if self._st(ch).tt <= self.last_end_ts:
                    self._read_until_tick(ch, self.last_end_ts, 0.0)
            if all(self._st(ch).tt > self.last_end_ts for ch in chans):
                top = max(self._st(ch).tt for ch in chans)
                for ch in chans:  # catch up with what is already available
                    if self._st(ch).tt < top:
                        self._read_until_tick(ch, top - 1, 0.0)
                return self._cut(common_tick(self._st(ch).tt for ch in chans))
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            lagging = next(ch for ch in chans if self._st(ch).tt <= self.last_end_ts)
            self._read_until_tick(lagging, self.last_end_ts, min(remaining, 0.1))

    def _cut(self, t: int) -> MsgPack:
        msgs: list[TsMsg] = []
        starts: list[MsgPosition] = []
        ends: list[MsgPosition] = []
        seen: set[tuple[int, int]] = set()
        sub = self.subscription or ""
        for ch in self.consumer_channels:
            st = self._st(ch)
            had = bool(st.buffer)
            take, st.buffer = split_by_tick(st.buffer, t)
            if had:
                starts.append(st.current or MsgPosition(ch, b"", sub, self.last_end_ts))
            for m in take:
                # 2.5 replays repeat a msgID; 2.6 messages are deduplicated by broker id in the decoder
                if self.dedupe and m.wal is None and isinstance(m, (InsertMsg, DeleteMsg)) and m.base_msg_id:
                    key = (m.msg_type, m.base_msg_id)
                    if key in seen:
                        continue
                    seen.add(key)
                msgs.append(m)
            anchor = st.buffer[0].position if st.buffer else st.tt_position
            if anchor is None:
                anchor = st.current or MsgPosition(ch, b"", sub, t)
            end = MsgPosition(ch, self._open_txn_start(ch, anchor.msg_id), sub, t, anchor.wal_name)
            st.current = end
            ends.append(end)
        pack = MsgPack(msgs, self.last_end_ts, t, starts, ends)
        self.last_end_ts = t
        return pack

    def _open_txn_start(self, ch: str, msg_id: bytes) -> bytes:
        """``msg_id``, or the Begin of a transaction still open if that is earlier (resuming must see it)."""
        begin = self.decoder(ch).oldest_open
        if begin is None or not msg_id:
            return msg_id
        if begin < self.client.bytes_to_message_id(msg_id):
            return begin.serialize()
        return msg_id
