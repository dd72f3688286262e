"""Driver-side channel scanning: where time ticks are, how many rows and bytes lie ahead.

The streaming source plans each micro-batch from this index: it never decodes inserts on
the driver (the type comes from the ``msg_type`` property or the header bytes, the row
count from a walk over the payload's top-level fields).
"""

from __future__ import annotations

import logging
import time
import weakref
from dataclasses import dataclass, field
from typing import Any

from msgstream_spark.errors import BackendTimeoutError, DataLossError, DecodeError
from msgstream_spark.msg import codec
from msgstream_spark.msg.types import MsgType
from msgstream_spark.msg.wire import iter_fields
from msgstream_spark.source.offsets import Entry, Offset, entry, normalize, unb64
from msgstream_spark.source.txncut import ScanItem, settle_cut, wal_item
from msgstream_spark.stream.ticks import Item, plan_cut, totals
from msgstream_spark.stream.txn import TxnAssembler

log = logging.getLogger(__name__)

# InsertRequest.num_rows = 14, DeleteRequest.num_rows = 11; timestamps = 10 in both
_NUM_ROWS_FIELD = {MsgType.Insert: 14, MsgType.Delete: 11}
SCAN_BATCH = 256  # messages per fetch: inserts run to ~0.5 MB each, so fetches stay bounded
MAX_SCAN_PER_CALL = 200_000


def peek_counts(payload: bytes, msg_type: int) -> tuple[int, int]:
    """(rows, base timestamp) of an insert/delete by walking top-level fields only."""
    want = _NUM_ROWS_FIELD.get(msg_type)
    rows = ts = 0
    try:
        for fno, wire, value, start in iter_fields(payload):
            if wire == 0 and fno == want:
                rows = value
            elif wire == 2 and fno == 1:  # MsgBase: timestamp = field 3
                for f2, w2, v2, _ in iter_fields(payload, start, start + value):
                    if f2 == 3 and w2 == 0:
                        ts = v2
    except (IndexError, ValueError):
        pass
    return rows, ts


@dataclass
class ChannelScan:
    channel: str
    items: list[Item] = field(default_factory=list)
    consumer: Any = None
    has_ticks: bool = False
    txns: TxnAssembler = field(default_factory=TxnAssembler)  # 2.6 transactions open after the last item
    last_id: Any = None  # the last message received (or the start's id before the first)


class Scanner:
    """Per-channel index of messages after the committed start, kept across micro-batches."""

    def __init__(self, client: Any, output: str, fail_on_data_loss: bool) -> None:
        self.client = client
        self.output = output
        self.fail_on_data_loss = fail_on_data_loss
        self.chans: dict[str, ChannelScan] = {}
        # Spark may never call the stream reader's stop(): remove the scan subscriptions when this
        # scanner is collected or the process exits, at the latest.
        self._finalizer = weakref.finalize(self, _drop_all, self.chans)

    def _open(self, ch: str, start: Entry) -> ChannelScan:
        cs = ChannelScan(ch)
        cons = self.client.reader(ch)  # records nothing on the broker, even if this process is killed
        mid = unb64(start.get("msgID", ""))
        try:
            if mid:
                cons.seek(self.client.bytes_to_message_id(mid), inclusive=bool(start.get("inclusive")))
            else:
                cons.seek(self.client.earliest_message_id(), inclusive=True)
        except DataLossError as exc:
            if self.fail_on_data_loss:
                raise DataLossError(f"{exc}; set failOnDataLoss=false to continue at the first retained message",
                                    channel=exc.channel) from exc
            log.warning("%s; scanning from the first retained message (failOnDataLoss=false)", exc)
            cons.seek(self.client.earliest_message_id(), inclusive=True)
        cs.consumer = cons
        if start.get("atTick"):
            cs.has_ticks = True  # a previous batch ended at a tick (not any message with a time: see offsets)
        self.chans[ch] = cs
        return cs

    def refresh(self, start: Offset, until: Offset | None = None, timeout: float = 60.0) -> None:
        """Drop items at or before ``start`` and read what arrived since the last call.

        ``until`` (Trigger.AvailableNow's target): a channel whose scan has not yet received the target's
        message keeps waiting for it, up to ``timeout`` seconds, instead of reporting "nothing new". Spark
        ends an AvailableNow query at the first plan without new data, so a broker slow to deliver what it
        already holds (a stream just opened, a loaded proxy) would end the run short, silently.
        """
        for ch, st in start.items():
            cs = self.chans.get(ch) or self._open(ch, st)
            mid = unb64(st.get("msgID", ""))
            if mid and not st.get("inclusive"):
                sid = self.client.bytes_to_message_id(mid)
                cs.items = [it for it in cs.items if it.id > sid]
                if cs.last_id is None or cs.last_id < sid:
                    cs.last_id = sid
            want = self._target_id(until, ch)
            budget = MAX_SCAN_PER_CALL
            deadline = None
            while budget > 0:
                batch = cs.consumer.receive_batch(min(SCAN_BATCH, budget), 0.05)
                if batch:
                    budget -= len(batch)
                    for m in batch:
                        cs.items.append(self._item(m, cs.txns))
                    cs.last_id = batch[-1].id
                    continue
                if want is None or (cs.last_id is not None and cs.last_id >= want):
                    break
                deadline = deadline or time.monotonic() + timeout
                if time.monotonic() > deadline:
                    raise BackendTimeoutError(
                        f"channel {ch}: the AvailableNow target {want} was not delivered within readTimeout="
                        f"{timeout:g}s (last message scanned: {cs.last_id}); the broker holds it but did not send it")
            if any(it.tick for it in cs.items):
                cs.has_ticks = True

    def _target_id(self, until: Offset | None, ch: str) -> Any:
        """The message id a refresh must reach on ``ch`` (``None``: no target, or an empty channel)."""
        mid = unb64((until or {}).get(ch, {}).get("msgID", ""))
        return self.client.bytes_to_message_id(mid) if mid else None

    def _item(self, m: Any, txns: TxnAssembler) -> Item:
        item = wal_item(m, self.output, txns, peek_counts)  # a 2.6 message: from its properties
        if item is not None:
            return item
        safe = not txns.has_open
        try:
            t = codec.peek_msg_type(m.payload, m.properties)
        except DecodeError:
            return ScanItem(m.id, 0, False, 1 if self.output == "messages" else 0, len(m.payload), safe)
        tick = t == MsgType.TimeTick
        if t in _NUM_ROWS_FIELD:
            rows, ts = peek_counts(m.payload, t)
        else:
            rows = 0
            _, ts = peek_counts(m.payload, t)
        if self.output == "messages":
            rows = 1
        return ScanItem(m.id, ts, tick, rows, len(m.payload), safe)

    def close(self) -> None:
        self._finalizer()


    # -- planning ------------------------------------------------------------------------
    def _views(self, start: Offset, cap: Offset | None) -> dict[str, list[Item]]:
        """Scanned items per channel, bounded by ``cap`` (Trigger.AvailableNow's target)."""
        views: dict[str, list[Item]] = {}
        for ch in start:
            items = self.chans[ch].items if ch in self.chans else []
            if cap is not None:
                cmid = cap.get(ch, {}).get("msgID", "")
                if not cmid:
                    items = []
                else:
                    cid = self.client.bytes_to_message_id(unb64(cmid))
                    items = [it for it in items if it.id <= cid]
            views[ch] = items
        return views

    def plan_end(self, start: Offset, *, align: bool | None, max_rows: int | None = None,
                 max_bytes: int | None = None, cap: Offset | None = None) -> tuple[Offset, int]:
        """The end offset of the next batch and the rows it holds (the cut: stream.ticks).

        Aligned channels are those carrying time ticks, or all when ``align`` is true. No cut
        falls inside an open 2.6 transaction (:func:`msgstream_spark.source.txncut.settle_cut`).
        """
        views = self._views(start, cap)
        aligned = {ch for ch in start if align is True or (align is None and self.chans.get(ch) and
                                                          self.chans[ch].has_ticks)}
        start_ts = {ch: int(st.get("ts", 0)) for ch, st in start.items()}
        chosen, rows = plan_cut(views, aligned, start_ts, max_rows=max_rows, max_bytes=max_bytes)
        if any(not getattr(it, "safe", True) for items in views.values() for it in items):
            # a 2.6 transaction is open somewhere: end every channel outside transactions
            reach = plan_cut(views, aligned, start_ts)[0] if (max_rows or max_bytes) else chosen
            chosen = settle_cut(views, aligned, chosen, reach)
            rows = totals(views, chosen)[0]
        end: Offset = {}
        for ch, st in start.items():
            n = chosen.get(ch, 0)
            if n == 0:
                end[ch] = dict(st)
            else:
                last = views[ch][n - 1]
                end[ch] = entry(last.id.serialize(), last.ts, atTick=last.tick)
        return normalize(end), rows

    def latest(self, start: Offset) -> Offset:
        """Uncapped end: every scanned message (for reportLatestOffset / AvailableNow targets)."""
        end: Offset = {}
        for ch, st in start.items():
            items = self.chans[ch].items if ch in self.chans else []
            end[ch] = (entry(items[-1].id.serialize(), items[-1].ts, atTick=items[-1].tick) if items
                       else dict(st))
        return normalize(end)


def _drop_all(chans: dict[str, ChannelScan]) -> None:
    for cs in chans.values():
        if cs.consumer is not None:
            try:
                cs.consumer.unsubscribe()  # a throwaway scan subscription
            except Exception:  # noqa: BLE001 - best effort
                log.warning("removing the scan subscription of %s failed", cs.channel, exc_info=True)
    chans.clear()
