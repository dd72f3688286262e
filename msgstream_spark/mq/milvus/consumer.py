"""Reading one pchannel through ``DumpMessages``: seek, resume exactly once, filter vchannels.

Positioning (the start id is always sent with ``include_start_message=true``, so the consumer can
check that the id it resumes from is still in the WAL):

* with resume hints (the id came from a delivered message: its ``_tt`` and ``_lc``), the stream
  starts at the ``_lc`` (the oldest entry when there is none) with ``start_timetick`` = the ``_tt``,
  and everything up to the id is dropped (a *barrier*), as Milvus's own CDC client does. A later
  ``_tt`` before the id means the id is gone: :class:`DataLossError`.
* without hints, the stream starts at the id itself; a first message with a *smaller* id means the
  proxy went back to the beginning (the id was truncated or lies past the end); for an exclusive
  seek, a first message other than the id means the id is gone.

A transaction arrives as BeginTxn, bodies, CommitTxn (each re-timed to the commit); it is handed
out only once complete, so a broken stream never leaves half a transaction delivered. A broken or
stalled stream (no item for ``milvus.idleTimeout``) is reopened after the last delivered message.
The proxy never sends TimeTicks; with ``ticks`` (``milvus.timeTicks``), a synthetic one at the last
delivered ``_tt`` follows each burst, so tick-aligned readers (TtMsgStream) can cut batches. It
carries that message's ``_lc``: a batch ending at it ends at Milvus's own position of the message
(start AT the ``_lc``, skip ``_tt`` <= the tick), never at a WAL id, because the proxy sends by
``_tt``: an entry still to come may lie before the last delivered one in the WAL (an insert
written while a transaction was open comes after that transaction's Commit).

Version-0 entries (written before the upgrade) can share a ``_tt``, and a burst can end between two of
them: a tick at their ``_tt`` would claim the rest had come. After such an entry the tick is at the ``_tt``
below and stands *before* the entries at that ``_tt`` (a ``TICK_BEFORE``: a resume from it, or from the
pack end it makes, reads all of them); a read that fills its batch there keeps them back for the next
call, so the tick can still precede them.
"""

from __future__ import annotations

import collections
import time
from types import MappingProxyType
from typing import Any

from msgstream_spark.errors import BackendError, BackendUnavailableError, ConsumeError, DataLossError
from msgstream_spark.mq.base import Consumer, Message, MessageID
from msgstream_spark.mq.milvus.connection import ProxyConnection, ProxyDown, rpc_error
from msgstream_spark.mq.milvus.dump import END, DumpRequest, DumpStream, Entry, StatusFailure
from msgstream_spark.mq.milvus.message_id import TICK_AFTER, TICK_BEFORE, MilvusMessageID, earliest_for
from msgstream_spark.msg.wal26 import WalMessageId, b36decode, b36encode, is_wal_message

_BEGIN, _COMMIT = "900", "901"
_RETRY_MIN, _RETRY_MAX = 0.05, 1.0


def message_of(channel: str, e: Entry) -> Message:
    """A :class:`Message` whose id carries the entry's ``_tt`` and ``_lc`` as resume hints."""
    props = e.properties
    tt = None
    if "_tt" in props:
        try:
            tt = b36decode(props["_tt"])
        except ValueError:
            tt = None
    lc = e.id.id if "_lcs" in props else props.get("_lc")
    mid = MilvusMessageID(e.id, tt, lc)
    return Message(channel, e.payload, MappingProxyType(props), mid, tt)


class MilvusConsumer(Consumer):
    def __init__(self, conn: ProxyConnection, channel: str, subscription: str, *,
                 vchannels: frozenset[str] | None = None, on_close: Any = None, latest: Any = None,
                 start_timetick: int = 0, end_timetick: int = 0, ticks: bool = False) -> None:
        self.channel = channel
        self._sub = subscription
        self._conn = conn
        self._settings = conn.settings
        self._vchannels = vchannels
        self._on_close = on_close
        self._latest = latest  # the client's latest-id scan for this pchannel
        self._start_tt, self._end_tt = start_timetick, end_timetick
        self._target: tuple[MilvusMessageID, bool] | None = None  # where the next stream starts
        self._stream: DumpStream | None = None
        self._barrier: MilvusMessageID | None = None
        self._keep_barrier = False
        self._check_back: MilvusMessageID | None = None  # ids below this mean the proxy went back
        self._first_must_be: MilvusMessageID | None = None
        self._txn: list[Message] = []
        self._ready: collections.deque[Message] = collections.deque()
        self._last: MilvusMessageID | None = None
        self._tick_after: MilvusMessageID | None = None  # a synthetic tick is due after this message
        self._run: list[Message] = []  # the last delivered version-0 entries, all at one _tt (more may come)
        self._run_prev: MilvusMessageID | None = None  # what was delivered before the run
        self._down_since: float | None = None  # when the proxy became unreachable
        self._retries = 0
        self._ticks = ticks
        self._acked: MilvusMessageID | None = None
        self.finished = False  # the stream reached end_timetick
        self._closed = False

    @property
    def subscription(self) -> str:
        return self._sub

    # -- positioning ---------------------------------------------------------------------------
    def seek(self, msg_id: MessageID, inclusive: bool = True) -> None:
        self._check_open()
        if not isinstance(msg_id, MilvusMessageID):
            raise ConsumeError(f"channel {self.channel}: cannot seek to a {type(msg_id).__name__} on the milvus "
                               "backend (use a Milvus WAL message id)")
        if msg_id.tick == TICK_AFTER:  # a synthetic tick stands right after its message
            msg_id, inclusive = MilvusMessageID(msg_id.wal_id, msg_id.time_tick, msg_id.last_confirmed), False
        elif msg_id.tick == TICK_BEFORE:  # before the version-0 entries at its _tt + 1: read them all
            inclusive = True
        self._drop_stream()
        self._ready.clear()
        self._last = self._tick_after = self._run_prev = None
        self._run = []
        self.finished = False
        self._target = (msg_id, inclusive)

    def _open(self) -> None:
        assert self._target is not None
        target, inclusive = self._target
        self._barrier = self._check_back = self._first_must_be = None
        start, start_tt = target.wal_id, self._start_tt
        if target.tick == TICK_BEFORE:  # Milvus's position: AT the entries' _lc, skip what is below their _tt
            lc = MilvusMessageID(WalMessageId(target.wal, target.last_confirmed)) if target.last_confirmed else None
            start = lc.wal_id if lc is not None else earliest_for(target.wal).wal_id
            start_tt = max(start_tt, target.time_tick + 1)
            self._check_back = lc
        elif target.at_earliest_position():
            pass
        elif target.time_tick:  # exact resume, as Milvus's CDC client does (from the oldest entry without _lc)
            start = (WalMessageId(target.wal, target.last_confirmed) if target.last_confirmed
                     else earliest_for(target.wal).wal_id)
            start_tt = max(start_tt, target.time_tick)
            self._barrier, self._keep_barrier = target, inclusive
        else:
            self._check_back = target
            if not inclusive:
                self._first_must_be = target
        req = DumpRequest(self.channel, start, True, start_tt, self._end_tt)
        try:
            self._stream = DumpStream(self._conn.open_stream(req.to_proto()))
        except BackendError:
            raise
        except Exception as exc:  # noqa: BLE001 - grpc errors, translated
            raise rpc_error(self._settings, f"DumpMessages of pchannel {self.channel}", exc) from None

    # -- receiving -----------------------------------------------------------------------------
    def receive(self, timeout: float) -> Message | None:
        got = self.receive_batch(1, timeout)
        return got[0] if got else None

    def receive_batch(self, max_messages: int, timeout: float) -> list[Message]:
        self._check_open()
        if self._target is None:
            raise ConsumeError(f"consumer of pchannel {self.channel} is not positioned: seek before receiving")
        deadline = time.monotonic() + max(0.0, timeout)
        idle_since = time.monotonic()
        while len(self._ready) < max_messages and not self.finished:
            if self._stream is None:
                if self._down_since is not None and time.monotonic() > deadline:
                    break  # the proxy is still down: report nothing now, retry on the next call
                try:
                    self._open()
                except ProxyDown as exc:
                    self._backoff(exc)
                    continue
            remaining = deadline - time.monotonic()
            item = self._stream.get(0.0 if self._ready else min(max(remaining, 0.0), 0.5))
            if item is None:
                if self._ready or self._tick_after is not None:
                    self._add_tick()  # the proxy paused: everything up to the last _tt has come
                    break
                if time.monotonic() - idle_since > self._settings.idle_timeout:
                    self._reopen()  # a stalled stream
                    idle_since = time.monotonic()
                if remaining <= 0:
                    break
                continue
            idle_since = time.monotonic()
            if isinstance(item, Entry):
                self._down_since, self._retries = None, 0
                self._take(item)
            elif item is END:
                self._stream_ended()
            else:
                self._failed(item)
        n = min(max_messages, len(self._ready))
        if self._ticks and n == len(self._ready) and 0 < len(self._run) < n and self._ready[-1] is self._run[-1]:
            n -= len(self._run)  # a full batch ends in a version-0 run: keep it for a tick to precede it
        return [self._ready.popleft() for _ in range(n)]

    def _add_tick(self) -> None:
        """A synthetic TimeTick at the last delivered ``_tt``: the proxy sends an entry only once a tick at or
        above its ``_tt`` was written, and never sends ticks; tick-aligned readers need them to cut.

        The tick carries that message's ``_lc``, so its position (a pack's end) is Milvus's own position of
        the message: start AT the ``_lc``, skip ``_tt`` <= the tick. Not the tick's id: the proxy sends by
        ``_tt``, so a message still to come can lie *before* it in the WAL (an insert written while a
        transaction was open comes after that transaction's Commit, whose id is larger)."""
        last, self._tick_after = self._tick_after, None
        if last is None or not self._ticks:
            return
        if self._run and self._run[-1].id is last:
            self._add_tick_before_run()
            return
        tick = MilvusMessageID(last.wal_id, last.time_tick, last.last_confirmed, tick=TICK_AFTER)
        self._ready.append(self._tick_message(tick, last.time_tick, last.last_confirmed))

    def _add_tick_before_run(self) -> None:
        """The tick after a burst ending in version-0 entries at one ``_tt`` X (more of them may follow): at X - 1,
        put before them, with the first one's ``_lc``; none once one of them was handed out (the next burst's
        tick covers them)."""
        run = self._run
        if len(self._ready) < len(run) or self._ready[-len(run)] is not run[0]:
            return
        first: MilvusMessageID = run[0].id  # type: ignore[assignment]
        tt, prev = first.time_tick - 1, self._run_prev
        wal_id = prev.wal_id if prev is not None and prev.time_tick == tt else first.wal_id  # orders after prev
        tick = MilvusMessageID(wal_id, tt, first.last_confirmed, tick=TICK_BEFORE)
        self._ready.insert(len(self._ready) - len(run), self._tick_message(tick, tt, first.last_confirmed))

    def _tick_message(self, tick: MilvusMessageID, tt: int, lc: str | None) -> Message:
        props = {"_v": "1", "_t": "1", "_tt": b36encode(tt)}
        if lc:
            props["_lc"] = lc
        return Message(self.channel, b"", MappingProxyType(props), tick, tt)

    def _stream_ended(self) -> None:
        self._drop_stream()
        self._txn.clear()
        if self._end_tt:
            self.finished = True
        else:
            self._resume_after_last()

    def _failed(self, exc: BaseException) -> None:
        """A broken stream: reopen after the last delivered message, or raise what cannot be retried."""
        import grpc

        self._drop_stream()
        self._txn.clear()
        if isinstance(exc, StatusFailure):
            raise ConsumeError(f"DumpMessages of pchannel {self.channel} failed on Milvus proxy "
                               f"{self._settings.address}: {exc}")
        err = rpc_error(self._settings, f"DumpMessages of pchannel {self.channel}", exc)
        code = exc.code() if isinstance(exc, grpc.RpcError) and hasattr(exc, "code") else None
        if code not in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.CANCELLED, grpc.StatusCode.INTERNAL):
            raise err
        self._backoff(err)
        self._resume_after_last()

    def _backoff(self, err: Exception) -> None:
        """Wait before reconnecting (a proxy restart); give up once it stayed away for milvus.requestTimeout."""
        now = time.monotonic()
        if self._down_since is None:
            self._down_since = now
        elif now - self._down_since > self._settings.request_timeout:
            raise BackendUnavailableError(f"{err}; still unreachable after milvus.requestTimeout="
                                          f"{self._settings.request_timeout:g}s") from None
        time.sleep(min(_RETRY_MAX, _RETRY_MIN * (2 ** self._retries)))
        self._retries += 1
        self._conn.close()  # reconnect (and Connect again) on the next open

    def _reopen(self) -> None:
        self._drop_stream()
        self._txn.clear()
        self._resume_after_last()

    def _resume_after_last(self) -> None:
        if self._last is not None:
            self._target = (self._last, False)

    # -- one entry -----------------------------------------------------------------------------
    def _take(self, e: Entry) -> None:
        m = message_of(self.channel, e)
        mid: MilvusMessageID = m.id  # type: ignore[assignment]
        if self._check_back is not None:
            if mid.wal_key() < self._check_back.wal_key():
                self._gone(self._check_back, f"the proxy went back to an earlier message ({mid})")
            if self._first_must_be is not None and not mid.same_entry(self._first_must_be):
                self._gone(self._first_must_be, f"the stream began at {mid} instead")
            self._check_back = self._first_must_be = None
            if self._target is not None and not self._target[1] and mid.same_entry(self._target[0]):
                return  # an exclusive seek: the id itself was checked, not delivered
        if self._barrier is not None:
            if mid.same_entry(self._barrier):
                self._barrier = None
                if not self._keep_barrier:
                    return
            else:
                if m.timestamp is not None and self._barrier.time_tick and m.timestamp > self._barrier.time_tick:
                    self._gone(self._barrier, f"a later time tick ({mid}) came first")
                return
        self._deliver(m)

    def _gone(self, target: MilvusMessageID, how: str) -> None:
        self._drop_stream()
        raise DataLossError(f"pchannel {self.channel}: message {target} is no longer in the WAL served by Milvus "
                            f"proxy {self._settings.address} (truncated by retention, or never delivered): {how}",
                            channel=self.channel)

    def _deliver(self, m: Message) -> None:
        props = m.properties
        if self._vchannels is not None and not self._wanted(props.get("_vc")):
            return
        t = props.get("_t") if is_wal_message(props) else None  # a version-0 entry's _t is no envelope's
        if t == _BEGIN or self._txn:
            self._txn.append(m)
            if t != _COMMIT:
                return
            done, self._txn = self._txn, []
        else:
            done = [m]
        self._ready.extend(done)
        self._note_run(None if is_wal_message(props) else m)
        self._last = done[-1].id  # type: ignore[assignment]
        self._tick_after = self._last if self._last.time_tick else None

    def _note_run(self, m: Message | None) -> None:
        """Track the trailing version-0 entries that share one ``_tt`` (``m``: a delivered 2.5 entry)."""
        tt = m.id.time_tick if m is not None else None  # type: ignore[union-attr]
        if not tt:
            self._run = []
        elif self._run and self._run[-1].id.time_tick == tt:  # type: ignore[union-attr]
            self._run.append(m)
        else:
            self._run, self._run_prev = [m], self._last

    def _wanted(self, vc: str | None) -> bool:
        return vc is None or vc in self._vchannels or vc.endswith("_vcchan") or vc == self.channel

    # -- the rest of the SPI ---------------------------------------------------------------------
    def ack(self, message: Message) -> None:
        self._acked = message.id  # type: ignore[assignment]

    @property
    def acked(self) -> MilvusMessageID | None:
        return self._acked

    def latest_message_id(self) -> MessageID | None:
        if self._latest is None:
            raise ConsumeError(f"consumer of pchannel {self.channel} was built without a latest-id scan")
        return self._latest(self.channel)

    def _drop_stream(self) -> None:
        if self._stream is not None:
            self._stream.close()
            self._stream = None

    def _check_open(self) -> None:
        if self._closed:
            raise ConsumeError(f"consumer of pchannel {self.channel} ({self._sub}) is closed")

    def close(self) -> None:
        self._end(unsubscribe=False)

    def unsubscribe(self) -> None:
        self._end(unsubscribe=True)

    def _end(self, unsubscribe: bool) -> None:
        """Close the stream once; ``on_close`` keeps the subscription's cursor or forgets it."""
        if self._closed:
            return
        self._closed = True
        self._drop_stream()
        if self._on_close is not None:
            self._on_close(self, unsubscribe)
