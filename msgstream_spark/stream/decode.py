"""The one per-channel decoder: raw broker messages of one pchannel -> Milvus messages, both formats.

Every reader (``MsgStream``/``TtMsgStream``, the Spark source, the CLI, the jobs) feeds the
messages of one pchannel, in broker order, to a :class:`ChannelDecoder` and gets back
:class:`Decoded` values: what a Milvus consumer would apply, in the order it would apply them.

Per message: without ``_v`` the 2.5 codec decodes it (time = BeginTs, vchannel = ShardName,
position = the broker id); with ``_v`` 1/2 the WAL decoder rebuilds it from its properties
(time = ``_tt``, vchannel = ``_vc``, position = ``_lc`` as Milvus's adaptor builds it, wal doc §4).
WAL messages then go through a :class:`~msgstream_spark.stream.txn.TxnAssembler`: transaction
bodies come out at their CommitTxn, re-timed to the commit. Two rules of Milvus's consumer (wal doc
§6) apply to WAL messages: a message whose ``_tt`` is below the last TimeTick seen (a "time tick
violation") is dropped, and so is a broker id at or before one already fed (a redelivery).

``start_ts`` is the seek filter of a resume (wal doc §4; wire doc §7.5): WAL messages with a time
tick <= ``start_ts`` are dropped (a transaction by its commit's); 2.5 messages follow
:class:`~msgstream_spark.stream.seek.SeekFilter`. The first TimeTick at or after ``start_ts`` ends it.

``feed`` raises :class:`DecodeError` (channel, position and bytes named) for a corrupt or encrypted
message, and :class:`UnknownMessageTypeError` for a 2.5 ``msg_type`` or a ``_v`` it does not know, so
each caller applies its own ``onDecodeError``; the decoder stays usable for the next message.
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from msgstream_spark.errors import ConfigError, ConsumeError, DecodeError
from msgstream_spark.mq.base import Message, MessageID
from msgstream_spark.msg.position import MsgPosition
from msgstream_spark.msg.types import DeleteMsg, InsertMsg, MsgType, TsMsg
from msgstream_spark.msg.wal26 import WalMessageId, WalMessageType, WALName, b36encode, decode_message, wal_position
from msgstream_spark.stream.seek import SeekFilter
from msgstream_spark.stream.txn import TxnAssembler

# mq backend type (``Client.name``) -> the WAL whose id form its ids have (the embedded log: RocksMQ's).
WAL_OF_BACKEND = {"local": WALName.RocksMQ, "kafka": WALName.Kafka, "pulsar": WALName.Pulsar,
                  "rocksmq": WALName.RocksMQ}


def wal_name(wal: str | WALName | int | None) -> WALName:
    """The WALName of a backend type (``local``/``kafka``/``pulsar``) or a WAL name/number.

    ``None`` (or ``Unknown``): a backend whose ids have no WAL form here; WAL positions then use the
    message's own broker id.
    """
    if isinstance(wal, WALName):
        return wal
    if wal is None:
        return WALName.Unknown
    if isinstance(wal, str) and wal.strip().lower() in WAL_OF_BACKEND:
        return WAL_OF_BACKEND[wal.strip().lower()]
    try:
        return WALName.parse(wal)
    except (ValueError, KeyError):
        raise ConfigError(f"unknown WAL {wal!r}; expected one of: local, kafka, pulsar") from None


def own_wal_id(wal: WALName, mid: MessageID) -> WalMessageId:
    """A broker message id as the WAL id string Milvus writes in ``_lc`` (b36 offset, or base64 MessageIdData)."""
    wid = getattr(mid, "wal_id", None)
    if isinstance(wid, WalMessageId):  # already a WAL id (the milvus backend's ids)
        return wid
    offset = mid.offset
    if wal in (WALName.Kafka, WALName.RocksMQ) and offset is not None:
        return WalMessageId(wal, b36encode(int(offset)))
    return WalMessageId.from_legacy_bytes(wal, mid.serialize())


@dataclass(slots=True)
class Decoded:
    """One message as a Milvus consumer applies it, with the broker message it came from."""

    msg: TsMsg  # InsertMsg/DeleteMsg/TimeTickMsg/... (2.5 classes) or a wal26.WalMsg
    raw: Message  # the broker message (payload, properties, id); a txn body's own, not the commit's
    time_tick: int  # ``_tt`` (a txn body: its commit's) or a 2.5 body's BeginTs
    vchannel: str | None  # ``_vc`` or ShardName; None = every vchannel of the pchannel
    position: MsgPosition  # 2.6: legacy bytes of ``_lc`` (as Milvus's adaptor); 2.5: the broker id
    version: int  # 0 for 2.5, 1/2 for WAL messages
    txn_id: int | None = None
    broadcast_id: int | None = None
    row_bearing: bool = False  # Insert/Delete of a data vchannel (never _vcchan, never a WalMsg)

    @property
    def is_tick(self) -> bool:
        return self.msg.msg_type == MsgType.TimeTick

    @property
    def wal_type(self) -> int | None:
        """The WAL message type (``_t``), None for a 2.5 message."""
        return None if self.msg.wal is None else int(self.msg.wal.msg_type)


class ChannelDecoder:
    """Decode one pchannel's broker messages, in broker order, the way Milvus's consumers do.

    ``wal`` is the backend's type (``local`` = RocksMQ-form int64 ids, ``kafka``, ``pulsar``) or a
    WALName. ``emit_control`` also releases BeginTxn/CommitTxn/RollbackTxn around their bodies (an
    ``output=messages`` view). ``group`` is put in the positions' ``msgGroup``. ``stats`` counts
    what was dropped and why (``tt_violations``, ``duplicates``, ``seek_skipped``, plus the
    assembler's ``committed``, ``rolled_back``, ``expired``, ``ignored_messages``). ``last_tick``:
    a read that starts right after a WAL TimeTick gives its ``_tt`` (the time-tick-violation rule's state).
    ``float_views``: inserts keep their float vectors as views of the payload (``InsertMsg.float_views``), for a
    reader that converts them through ``InsertMsg.field_arrays``.
    """

    def __init__(self, channel: str, wal: str | WALName, *, start_ts: int | None = None,
                 emit_control: bool = False, group: str = "",
                 id_of: Callable[[bytes], MessageID] | None = None, last_tick: int | None = None,
                 float_views: bool = False) -> None:
        self.channel = channel
        self.wal = wal_name(wal)
        self.group = group
        self.start_ts = start_ts
        self.emit_control = emit_control
        self.float_views = float_views
        self.id_of = id_of  # legacy id bytes -> the backend's MessageID (Client.bytes_to_message_id)
        self.txn = TxnAssembler(emit_control=emit_control)
        self._seek = SeekFilter(start_ts)
        self._first_id: MessageID | None = None
        self._replay_until: MessageID | None = None
        self.rewind_to: MessageID | None = None  # set when the read began after an open txn's Begin
        self._raws: dict[int, Message] = {}  # id(msg) -> broker message, for bodies held by open txns
        # ``_tt`` of the last WAL TimeTick fed; given when the read starts right after one (a cut range)
        self._last_tick: int | None = None if last_tick is None else int(last_tick)
        self._last_id: MessageID | None = None
        self._lc_text: str | None = None  # the last ``_lc`` turned into legacy bytes, and those bytes
        self._lc_bytes, self._lc_wal = b"", 0
        self.stats: Counter[str] = Counter()

    # -- queries -------------------------------------------------------------------------------------
    @property
    def has_open(self) -> bool:
        """A transaction is open: a batch must not end here (its bodies would be lost or split)."""
        return self.txn.has_open

    @property
    def oldest_open(self) -> MessageID | None:
        """The broker id of the oldest open transaction's BeginTxn (resume there, inclusive), or None."""
        raw = self.oldest_open_raw
        return None if raw is None else raw.id

    @property
    def oldest_open_raw(self) -> Message | None:
        txn = self.txn.oldest_open()
        return None if txn is None else self._raws.get(id(txn.begin))

    @property
    def last_tick(self) -> int | None:
        """The ``_tt`` of the last WAL TimeTick fed (None before the first)."""
        return self._last_tick

    @property
    def seeking(self) -> bool:
        """True while ``start_ts`` still drops messages."""
        return self._seek.active

    # -- feeding -------------------------------------------------------------------------------------
    def feed(self, m: Message) -> list[Decoded]:
        """Take the next broker message of the channel; return what it releases, in release order."""
        if self._last_id is not None and m.id <= self._last_id:
            self.stats["duplicates"] += 1
            return []
        self._last_id = m.id
        if self._first_id is None:
            self._first_id = m.id
        if self.wal == WALName.Unknown:  # ids that name their WAL (the milvus backend's) tell it
            wal = getattr(m.id, "wal", None)
            if isinstance(wal, WALName) and wal != WALName.Unknown:
                self.wal = wal
        out = self._feed(m)
        if self._replay_until is not None:
            if m.id < self._replay_until:
                return []  # replaying to rebuild open transactions: this was delivered before
            self._replay_until = None
        return out

    def rewound(self, until: MessageID) -> ChannelDecoder:
        """A fresh decoder for a re-read from :attr:`rewind_to`: what it releases before ``until`` is dropped
        (already delivered), but the transactions it sees on the way are rebuilt."""
        dec = ChannelDecoder(self.channel, self.wal, start_ts=self.start_ts, emit_control=self.emit_control,
                             group=self.group, id_of=self.id_of, float_views=self.float_views)
        dec._replay_until = until
        dec.stats.update(self.stats)
        dec.stats["rewinds"] += 1
        return dec

    def _feed(self, m: Message) -> list[Decoded]:
        mid = m.id.serialize()
        msg = decode_message(m.payload, m.properties, channel=self.channel, msg_id=mid, float_views=self.float_views)
        if msg.wal is None:
            return self._keep([self._classic(msg, m, mid)])
        env = msg.wal
        if env.msg_type == WalMessageType.TimeTick and env.all_vchannels:
            self._last_tick = max(self._last_tick or 0, env.time_tick)
        elif self._last_tick is not None and env.time_tick < self._last_tick:
            self.stats["tt_violations"] += 1  # Milvus's reorder buffer refuses it
            return []
        msg.position = self._wal_position(msg, m)
        if env.txn is None and not self.txn.has_open:  # most messages: nothing to assemble or expire
            return self._keep([self._wal(msg, m)])
        self._check_orphan(env)
        self._raws[id(msg)] = m
        released = self.txn.feed(msg)
        out = [self._wal(r, self._raws.get(id(r))) for r in released]
        self._forget(released)
        return self._keep(out)

    def feed_all(self, msgs: Iterable[Message]) -> list[Decoded]:
        """Feed many (no error handling: the first DecodeError propagates)."""
        out: list[Decoded] = []
        for m in msgs:
            out.extend(self.feed(m))
        return out

    # -- helpers -------------------------------------------------------------------------------------
    def _classic(self, msg: TsMsg, m: Message, mid: bytes) -> Decoded:
        tt = int(msg.begin_ts)
        msg.position = MsgPosition(self.channel, mid, self.group, tt)
        shard = getattr(msg.proto, "shardName", "") or None
        return Decoded(msg, m, tt, shard, msg.position, 0, None, None, isinstance(msg, (InsertMsg, DeleteMsg)))

    def _wal_position(self, msg: TsMsg, m: Message) -> MsgPosition:
        env = msg.wal
        lc = env.last_confirmed
        if lc is not None and not env.last_confirmed_self and lc == self._lc_text:
            # consecutive messages mostly share their ``_lc``: its legacy bytes are worked out once
            return MsgPosition(env.vchannel or self.channel, self._lc_bytes, self.group, env.time_tick,
                               self._lc_wal)
        pos = None
        if self.wal != WALName.Unknown:
            try:
                own = own_wal_id(self.wal, m.id) if env.last_confirmed_self else None
                pos = wal_position(env, self.wal, own)
            except DecodeError as exc:
                raise exc.with_location(self.channel, m.id.serialize()) from None
        if pos is None:  # neither _lc nor _lcs (a replicated message): its own id, as legacy bytes
            own_bytes = m.id.serialize()
            if self.wal != WALName.Unknown:
                try:
                    own_bytes = own_wal_id(self.wal, m.id).to_legacy_bytes()
                except DecodeError:
                    pass  # an id this WAL cannot express: the broker's own bytes
            pos = MsgPosition(self.channel, own_bytes, "", env.time_tick, int(self.wal))
        elif lc is not None and not env.last_confirmed_self:
            self._lc_text, self._lc_bytes, self._lc_wal = lc, pos.msg_id, pos.wal_name
        return MsgPosition(pos.channel_name or self.channel, pos.msg_id, self.group, pos.timestamp, pos.wal_name)

    def _check_orphan(self, env) -> None:
        """A body or end of a transaction whose Begin this read never saw: ask to re-read from its ``_lc``.

        Milvus keeps every message's last-confirmed id at or before the Begin of each transaction still
        open when it was written (its ack manager does not move past an open transaction), so re-reading
        from ``_lc`` finds the Begin.
        """
        if (env.txn is None or env.msg_type == WalMessageType.BeginTxn or self.rewind_to is not None
                or self.id_of is None or not env.last_confirmed or self.wal == WALName.Unknown):
            return
        if env.txn.txn_id in {t.txn_id for t in self.txn.open_transactions()} or self.txn.outcome(env.txn.txn_id):
            return
        try:
            target = self.id_of(WalMessageId(self.wal, env.last_confirmed).to_legacy_bytes())
        except DecodeError:
            return  # an _lc that is not an id of this WAL: nothing to re-read from
        if self._first_id is not None and target < self._first_id:
            self.rewind_to = target

    def _wal(self, msg: TsMsg, raw: Message | None) -> Decoded:
        env = msg.wal
        row = isinstance(msg, (InsertMsg, DeleteMsg)) and not env.is_control_vchannel
        return Decoded(msg, raw, env.time_tick, env.vchannel, msg.position, env.version, env.txn_id,
                       env.broadcast_id, row)

    def _forget(self, released: list[TsMsg]) -> None:
        """Drop broker messages no open transaction holds any more (released, rolled back, expired)."""
        for r in released:
            self._raws.pop(id(r), None)
        if not self.txn.has_open:
            self._raws.clear()
        elif len(self._raws) > 2 * self._held() + 16:  # bodies of rolled-back, expired or unknown txns
            held = {id(t.begin) for t in self.txn.open_transactions()}
            held.update(id(b) for t in self.txn.open_transactions() for b in t.bodies)
            self._raws = {k: v for k, v in self._raws.items() if k in held}

    def _held(self) -> int:
        return sum(1 + len(t.bodies) for t in self.txn.open_transactions())

    def _keep(self, out: list[Decoded]) -> list[Decoded]:
        """Apply the seek filter of ``start_ts`` to released messages."""
        if not self._seek.active:
            return out
        kept = []
        for d in out:
            if not self._seek.active:  # a tick ended the filter: the rest stays
                kept.append(d)
                continue
            if d.version == 0:
                keep = self._seek.keep(d.is_tick, d.time_tick)
            else:
                keep = d.time_tick > self._seek.ts  # Milvus's TimeTickGT filter (later ticks stay too)
                if d.is_tick:
                    self._seek.keep(True, d.time_tick)
            if keep:
                kept.append(d)
            else:
                self.stats["seek_skipped"] += 1
        return kept


_MAX_REWINDS = 8


def rebuild_from_last_confirmed(client: Any, dec: ChannelDecoder, message: Message, *,
                                timeout: float = 60.0) -> tuple[ChannelDecoder, list[Decoded]]:
    """After ``dec.rewind_to`` was set by ``message``: a decoder that has read the channel from there.

    A throwaway reader replays ``[rewind_to, message)`` into :meth:`ChannelDecoder.rewound` (what those
    messages release was delivered already, or dropped, and stays so; decode errors there were reported
    the first time), then ``message`` is fed again. Returns the new decoder and what ``message``
    releases. The caller's own consumer is not moved. ConsumeError when the replay stalls ``timeout`` s.
    """
    new = dec.rewound(message.id)
    reader = client.reader(dec.channel)
    try:
        reader.seek(dec.rewind_to, inclusive=True)
        deadline = time.monotonic() + timeout
        done = False
        while not done:
            batch = reader.receive_batch(256, max(0.0, min(1.0, deadline - time.monotonic())))
            if not batch and time.monotonic() >= deadline:
                raise ConsumeError(f"channel {dec.channel}: re-reading from {dec.rewind_to!r} to rebuild an open "
                                   f"transaction stalled before {message.id!r} ({timeout:.0f}s)")
            for m in batch:
                if m.id >= message.id:
                    done = True
                    break
                try:
                    new.feed(m)
                except DecodeError:
                    pass  # reported (or skipped) when it was first read
    finally:
        reader.unsubscribe()
    if new.rewind_to is not None and new.stats["rewinds"] < _MAX_REWINDS:  # another, older open transaction
        return rebuild_from_last_confirmed(client, new, message, timeout=timeout)
    return new, new.feed(message)


__all__ = ["WAL_OF_BACKEND", "ChannelDecoder", "Decoded", "own_wal_id", "rebuild_from_last_confirmed", "wal_name"]
