"""MsgStream: produce MsgPacks with Milvus's hash repack, broadcast, consume and seek.

This is the plain ``MqMsgStream`` of Milvus (wire doc §5.1-5.2, §7.3): on the consumer
side every message becomes its own pack. :class:`TtMsgStream` builds on it. Consumed messages
of both formats (2.5, and Milvus 2.6 WAL messages) go through one
:class:`~msgstream_spark.stream.decode.ChannelDecoder` per channel: transaction bodies come out
at their commit, rolled-back and expired ones never.
"""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping, Sequence

from msgstream_spark.errors import ConfigError, ConsumeError, DecodeError, MsgStreamError, ProduceError
from msgstream_spark.mq.base import (
    Client,
    Consumer,
    Message,
    MessageID,
    Producer,
    ProducerMessage,
    SubscriptionInitialPosition,
)
from msgstream_spark.msg import codec
from msgstream_spark.msg.position import MsgPosition
from msgstream_spark.msg.types import MsgPack, TsMsg
from msgstream_spark.msg.wal26 import decode_message
from msgstream_spark.stream.decode import ChannelDecoder, rebuild_from_last_confirmed, wal_name
from msgstream_spark.stream.names import to_physical_channel
from msgstream_spark.stream.sender import close_all, send_per_channel

log = logging.getLogger(__name__)

# A repack function maps (messages, hash-derived channel indices per message) to
# {channel index: [messages]}; see default_repack.
RepackFunc = Callable[[Sequence[TsMsg], Sequence[Sequence[int]]], dict[int, list[TsMsg]]]

ON_DECODE_ERROR = ("fail", "skip")


def default_repack(msgs: Sequence[TsMsg], keys: Sequence[Sequence[int]]) -> dict[int, list[TsMsg]]:
    """Whole message to the channel of its first hash value (Milvus's proxy repack)."""
    out: dict[int, list[TsMsg]] = {}
    for m, k in zip(msgs, keys):
        if len(k) == 0:
            raise ProduceError(f"{type(m).__name__} has no hash values: cannot choose a channel")
        out.setdefault(int(k[0]), []).append(m)
    return out


class MsgStream:
    """Producer and/or consumer over a set of channels of one backend.

    Use as a context manager; ``close()`` releases producers, consumers and the client
    (when ``own_client`` is true).
    """

    def __init__(self, client: Client, *, repack: RepackFunc | None = None,
                 on_decode_error: str = "fail", own_client: bool = True) -> None:
        if on_decode_error not in ON_DECODE_ERROR:
            raise ConfigError(f"on_decode_error must be one of {ON_DECODE_ERROR}, got {on_decode_error!r}")
        self.client = client
        self.repack = repack or default_repack
        self.on_decode_error = on_decode_error
        self.own_client = own_client
        self.producer_channels: list[str] = []
        self._producers: dict[str, Producer] = {}
        self.consumer_channels: list[str] = []
        self.subscription: str | None = None
        self._consumers: dict[str, Consumer] = {}
        self._rr = 0  # round-robin cursor over consumers
        self._closed = False
        self.skipped: list[DecodeError] = []  # decode errors skipped with on_decode_error="skip"
        self._decoders: dict[str, ChannelDecoder] = {}
        self._ready: deque[TsMsg] = deque()  # decoded, not yet handed out (a commit releases several)

    # -- producing -------------------------------------------------------------------
    def as_producer(self, channels: Sequence[str]) -> None:
        """Open a producer per channel (in this order: hash % len(channels) picks one)."""
        self._check_open()
        for ch in channels:
            if ch not in self._producers:
                self._producers[ch] = self.client.create_producer(ch)
                self.producer_channels.append(ch)

    def produce(self, pack: MsgPack | Sequence[TsMsg]) -> dict[str, list[MessageID]]:
        """Route every message by its hash values and send; returns ids per channel.

        Messages for one channel are sent in one ordered batch; channels in parallel.
        """
        msgs = list(pack.msgs if isinstance(pack, MsgPack) else pack)
        if not msgs:
            return {}
        n = self._n_producers()
        keys = [[int(h) % n for h in (m.hash_values if len(m.hash_values) else [0])] for m in msgs]
        groups = self.repack(msgs, keys)
        per_channel = {self.producer_channels[i]: ms for i, ms in groups.items()}
        return self._send_groups(per_channel, with_type=True)

    def broadcast(self, pack: MsgPack | Sequence[TsMsg]) -> dict[str, list[MessageID]]:
        """Send every message, unchanged, to every producer channel."""
        msgs = list(pack.msgs if isinstance(pack, MsgPack) else pack)
        self._n_producers()
        if not msgs:
            return {}
        return self._send_groups({ch: msgs for ch in self.producer_channels}, with_type=True)

    def _send_groups(self, per_channel: Mapping[str, list[TsMsg]], *, with_type: bool) -> dict[str, list[MessageID]]:
        encoded = {ch: [self._encode(m, with_type) for m in ms] for ch, ms in per_channel.items()}
        return send_per_channel(encoded, lambda ch, batch: self._producers[ch].send_batch(batch))

    @staticmethod
    def _encode(m: TsMsg, with_type: bool) -> ProducerMessage:
        payload, props = codec.marshal(m)
        if not with_type:
            props = {k: v for k, v in props.items() if k != "msg_type"}
        return ProducerMessage(payload, props, timestamp=int(m.end_ts))

    def _n_producers(self) -> int:
        self._check_open()
        if not self.producer_channels:
            raise ConfigError("this MsgStream has no producer channels: call as_producer(channels) first")
        return len(self.producer_channels)

    # -- consuming -------------------------------------------------------------------
    def as_consumer(self, channels: Sequence[str], subscription: str,
                    initial_position: SubscriptionInitialPosition | str = SubscriptionInitialPosition.EARLIEST,
                    ) -> None:
        """Subscribe to each channel under ``subscription``."""
        self._check_open()
        pos = SubscriptionInitialPosition.parse(initial_position)
        if self.subscription is not None and subscription != self.subscription:
            raise ConfigError(f"MsgStream already consumes as {self.subscription!r}, not {subscription!r}")
        self.subscription = subscription
        for ch in channels:
            if ch not in self._consumers:
                self._consumers[ch] = self.client.subscribe(ch, subscription, pos)
                self.consumer_channels.append(ch)

    # Whether a seek drops what is at or before the position's timestamp (TtMsgStream: always;
    # here only for Milvus 2.6 positions, whose msgID is a last-confirmed id to start AT).
    _seek_filters = False

    def seek(self, positions: Sequence[MsgPosition], inclusive: bool = False) -> None:
        """Position each named channel at its MsgPosition's message id.

        A Milvus 2.6 position (``wal_name`` set: the msgID is the ``_lc`` of a message) starts AT the id
        and skips what has a time tick <= its timestamp, as Milvus resumes (wal doc §4).
        """
        for p in positions:
            consumer = self._consumer_for(p.channel_name)
            if not p.msg_id:
                raise ConsumeError(f"cannot seek channel {p.channel_name}: the position has an empty msgID")
            wal = bool(p.wal_name)
            consumer.seek(self.client.bytes_to_message_id(p.msg_id), inclusive=inclusive or wal)
            self._ready.clear()
            self._reset_decoder(consumer.channel, p.timestamp if (wal or self._seek_filters) else None)

    def _reset_decoder(self, channel: str, start_ts: int | None = None) -> ChannelDecoder:
        try:
            wal = wal_name(self.client.name)
        except ConfigError:  # a backend registered by a user: WAL positions use its own ids
            wal = wal_name(None)
        dec = ChannelDecoder(channel, wal, start_ts=start_ts, group=self.subscription or "",
                             id_of=self.client.bytes_to_message_id)
        self._decoders[channel] = dec
        return dec

    def decoder(self, channel: str) -> ChannelDecoder:
        """The decoder of a consumed channel (its transaction state, ``has_open``, ``stats``)."""
        dec = self._decoders.get(channel)
        return dec if dec is not None else self._reset_decoder(channel)

    def _consumer_for(self, channel: str) -> Consumer:
        try:
            return self._consumers[channel]
        except KeyError:
            # Milvus positions may name a vchannel; map it to its pchannel.
            phys = to_physical_channel(channel)
            if phys in self._consumers:
                return self._consumers[phys]
            raise ConsumeError(
                f"position names channel {channel!r}, which this stream does not consume "
                f"(consumed: {', '.join(self.consumer_channels) or 'none'})"
            ) from None

    def decode(self, message: Message) -> TsMsg | None:
        """Decode one backend message alone (either format, no transaction assembly) and attach its broker
        position; None when skipped. Consuming goes through :meth:`decode_all`."""
        try:
            msg = decode_message(message.payload, message.properties,
                                 channel=message.channel, msg_id=message.id.serialize())
        except DecodeError as exc:
            if self.on_decode_error == "skip":
                log.warning("skipping undecodable message: %s", exc)
                self.skipped.append(exc)
                return None
            raise
        msg.position = MsgPosition(message.channel, message.id.serialize(), self.subscription or "",
                                   int(msg.begin_ts))
        return msg

    def decode_all(self, message: Message) -> list[TsMsg]:
        """Feed one backend message to its channel's decoder: the messages it releases, positions set.

        A 2.6 transaction's bodies come out at its CommitTxn. When the read began after an open
        transaction's Begin, the channel is re-read from the body's ``_lc`` (as Milvus resumes) so the
        transaction is whole; what was already delivered is not delivered again.
        """
        dec = self.decoder(message.channel)
        try:
            out = dec.feed(message)
        except DecodeError as exc:
            if self.on_decode_error == "skip":
                log.warning("skipping undecodable message: %s", exc)
                self.skipped.append(exc)
                return []
            raise
        if dec.rewind_to is not None:
            log.info("channel %s: a transaction began before the start; re-reading from its last-confirmed "
                     "id %r", message.channel, dec.rewind_to)
            self._decoders[message.channel], out = rebuild_from_last_confirmed(self.client, dec, message)
        return [d.msg for d in out]

    def receive(self, timeout: float) -> tuple[Consumer, Message] | None:
        """The next raw message from any channel (round robin), or None after ``timeout``."""
        if not self._consumers:
            raise ConfigError("this MsgStream has no consumers: call as_consumer(...) first")
        consumers = [self._consumers[c] for c in self.consumer_channels]
        deadline = time.monotonic() + max(0.0, timeout)
        while True:
            for _ in range(len(consumers)):
                c = consumers[self._rr % len(consumers)]
                self._rr += 1
                m = c.receive(0.0)
                if m is not None:
                    return c, m
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            # block briefly on one consumer so we do not spin
            c = consumers[self._rr % len(consumers)]
            self._rr += 1
            m = c.receive(min(remaining, 0.05))
            if m is not None:
                return c, m

    def consume(self, timeout: float = 1.0) -> MsgPack | None:
        """One message as its own pack (Milvus's plain stream), or None after ``timeout``."""
        deadline = time.monotonic() + max(0.0, timeout)
        while not self._ready:
            got = self.receive(max(0.0, deadline - time.monotonic()))
            if got is None:
                return None
            consumer, raw = got
            consumer.ack(raw)
            self._ready.extend(self.decode_all(raw))
        msg = self._ready.popleft()
        pos = msg.position
        return MsgPack([msg], msg.begin_ts, msg.end_ts, [pos], [pos])

    def iterate(self, timeout: float = 1.0) -> Iterator[MsgPack]:
        """Yield packs until none arrives for ``timeout`` seconds."""
        while True:
            pack = self.consume(timeout)
            if pack is None:
                return
            yield pack

    # -- lifecycle ---------------------------------------------------------------------
    def _check_open(self) -> None:
        if self._closed:
            raise MsgStreamError("this MsgStream is closed")

    def close(self) -> None:
        """Close producers (flushing), consumers and, if owned, the client. Idempotent."""
        if self._closed:
            return
        self._closed = True
        first = close_all([*self._producers.values(), *self._consumers.values()],
                          *([self.client.close] if self.own_client else []))
        if first is not None:
            raise first

    def __enter__(self) -> MsgStream:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
