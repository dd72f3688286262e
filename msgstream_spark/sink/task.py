"""One write task of the sink: encode, buffer, produce, end with time ticks, report.

Used by the Spark writers and, without Spark, by the CLI's ``publish``. Messages carry
``(writer id, batch id, task id, sequence)`` in their properties and get message ids
derived from them, so a retried task reproduces the same keys and a reader with
``dedupe`` can drop the replay.
"""

from __future__ import annotations

import base64
import logging
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from msgstream_spark.errors import BackendError, MsgStreamError, ProduceError
from msgstream_spark.mq.base import ProducerMessage
from msgstream_spark.mq.registry import build_client
from msgstream_spark.msg import tso
from msgstream_spark.msg.pb import common_pb2, msg_pb2
from msgstream_spark.sink.dedupe import PROP_BATCH, PROP_SEQ, PROP_TASK, PROP_WRITER
from msgstream_spark.sink.encode import OP_INSERT, EncodedMessage, Encoder
from msgstream_spark.sink.options import SinkOptions, stable_id
from msgstream_spark.sink.plan import WritePlan
from msgstream_spark.sink.wal import WalFormat
from msgstream_spark.stream.sender import close_all, send_per_channel

log = logging.getLogger(__name__)

# Called with the TaskWriter once its rows are produced and acknowledged, before the closing
# time ticks. Empty in the product; fault-injection tests install theirs here.
AFTER_PRODUCE: list[Callable[[TaskWriter], None]] = []

# A task's first flush comes at this many bytes (or ``bufferBytes`` when smaller), each next one at twice the
# last, up to ``bufferBytes``: the produce starts after the first Arrow batch or so instead of after the first
# 4 MiB, and overlaps Spark's hand-over of the rest.
FIRST_FLUSH_BYTES = 512 * 1024



def committed_key(writer_id: str) -> str:
    """Backend metadata key holding the last batch id a streaming sink committed."""
    return f"msgstream-sink/{writer_id}/committed-batch"


@dataclass
class ChannelStats:
    """What one task wrote to one channel (plain data, in the commit message)."""

    messages: int = 0
    inserted: int = 0
    deleted: int = 0
    bytes: int = 0
    first_id: str = ""  # base64 of the Milvus msgID bytes
    last_id: str = ""
    max_ts: int = 0
    time_tick: int = 0
    txn_id: int = 0  # wireFormat=2.6 with transactional=true: this task's transaction on the channel
    txn: str = ""  # committed | rolled_back | open (the task failed and could not roll back)


@dataclass
class TaskResult:
    """Summary of one task (what the Spark commit message carries)."""

    writer_id: str
    batch_id: int
    task_id: int
    attempt: int
    channels: dict[str, ChannelStats] = field(default_factory=dict)
    skipped: bool = False  # the batch was already committed: nothing written

    @property
    def rows(self) -> int:
        return sum(s.inserted + s.deleted for s in self.channels.values())


class HybridClock:
    """Strictly increasing hybrid timestamps from the wall clock (physical ms << 18 | logical)."""

    def __init__(self) -> None:
        self.last = 0

    def __call__(self) -> int:
        ts = max(int(tso.now()), self.last + 1)
        self.last = ts
        return ts


class TaskWriter:
    """Writes the rows of one task. Connects lazily; ``close()`` always releases the client."""

    def __init__(self, opts: SinkOptions, plan: WritePlan, *, batch_id: int = 0, task_id: int = 0,
                 attempt: int = 0, client=None, ticks: bool = True) -> None:
        self.opts = opts
        self.ticks = ticks  # False: the caller sends the closing ticks (the Spark driver, for 2.6)
        self.plan = plan
        self.result = TaskResult(opts.writer_id, batch_id, task_id, attempt)
        self.clock = HybridClock()
        self._seq = [0] * len(opts.channels)
        self._row_base = stable_id(opts.writer_id, str(batch_id), str(task_id), "rows", bits=31) << 32
        self._rows_used = 0
        self.encoder = Encoder(opts, plan, self.clock, self._msg_id, self._row_ids)
        self._pending: dict[int, list] = {}
        self._pending_bytes = 0
        self._flush_at = min(FIRST_FLUSH_BYTES, opts.buffer_bytes)  # grows to bufferBytes (FIRST_FLUSH_BYTES)
        self._io = None  # one background thread producing while the next batches are encoded
        self._inflight = None
        self._client = client
        self._own_client = client is None
        self._producers: dict[str, object] = {}
        self.wal: WalFormat | None = None  # wireFormat=2.6: builds the WAL messages
        if opts.wire_format == "2.6":
            self.wal = WalFormat(opts, opts.load_config().mq_type, self.clock() if opts.transactional else 0)

    # -- ids ----------------------------------------------------------------------------
    def _msg_id(self, shard: int) -> tuple[int, int]:
        seq = self._seq[shard]
        self._seq[shard] += 1
        r = self.result
        return stable_id(r.writer_id, str(r.batch_id), str(r.task_id), self.opts.channels[shard], str(seq)), seq

    def _row_ids(self, n: int):
        start = self._rows_used
        self._rows_used += n
        return np.arange(self._row_base + start, self._row_base + start + n, dtype=np.int64)

    # -- backend ------------------------------------------------------------------------
    @property
    def client(self):
        if self._client is None:
            cfg = self.opts.load_config()
            self._client = build_client(cfg.mq_type, cfg)
        return self._client

    def _producer(self, channel: str):
        p = self._producers.get(channel)
        if p is None:
            try:
                p = self._producers[channel] = self.client.create_producer(channel)
            except Exception as exc:  # noqa: BLE001 - client libraries raise anything
                raise BackendError(f"cannot create a producer for channel {channel}: {exc}") from exc
        return p

    def already_committed(self) -> bool:
        """True when a stable-id streaming writer already committed this batch (skip it)."""
        if not self.opts.writer_id_explicit:
            return False
        got = self.client.get_metadata(committed_key(self.opts.writer_id))
        return got is not None and int(got) >= self.result.batch_id

    # -- writing ------------------------------------------------------------------------
    def write_batches(self, batches: Iterable[pa.RecordBatch]) -> TaskResult:
        """Encode and produce every batch, then send the closing time ticks."""
        try:
            for batch in batches:
                self.add(batch)
            self.finish()
        finally:
            self.close()
        return self.result

    def add(self, batch: pa.RecordBatch) -> None:
        """Validate and encode ``batch``; produce once enough is buffered."""
        for m in self.encoder.encode(batch):
            self._pending.setdefault(m.shard, []).append(m)
            self._pending_bytes += len(m.payload)
        if self._pending_bytes >= self._flush_at:
            self._flush_at = min(2 * self._flush_at, self.opts.buffer_bytes)
            self.flush()

    def _keys(self, seq: int) -> dict[str, str]:
        """The exactly-once properties (writer, batch, task, seq)."""
        r = self.result
        return {PROP_WRITER: r.writer_id, PROP_BATCH: str(r.batch_id), PROP_TASK: str(r.task_id), PROP_SEQ: str(seq)}

    def _props(self, m: EncodedMessage) -> dict[str, str]:
        if self.wal is not None:
            return self.wal.body_properties(m, self._keys(m.seq))
        return {"msg_type": "Insert" if m.op == OP_INSERT else "Delete", **self._keys(m.seq)}

    def flush(self, wait: bool = False) -> None:
        """Produce everything buffered: one ordered batch per channel, channels in parallel.

        The send runs in a background thread (one at a time, so order is kept) while the
        caller encodes more; ``wait`` blocks until everything sent is acknowledged.
        """

        if not self._pending:
            if wait:
                self._wait_inflight()
            return
        work = {}
        for shard, msgs in sorted(self._pending.items()):
            ch = self.opts.channels[shard]
            work[ch] = (msgs, [ProducerMessage(m.payload, self._props(m), timestamp=m.timestamp) for m in msgs])
        self._pending = {}
        self._pending_bytes = 0
        self._wait_inflight()
        for ch in work:
            self._producer(ch)  # open producers in this thread
        if self._io is None:
            self._io = ThreadPoolExecutor(max_workers=1, thread_name_prefix="msgstream-sink-io")
        self._inflight = self._io.submit(self._send, work)
        if wait:
            self._wait_inflight()

    def _wait_inflight(self) -> None:
        fut, self._inflight = self._inflight, None
        if fut is not None:
            fut.result()

    def _send(self, work: dict) -> None:
        for ch in work:
            self._producer(ch)  # open producers before threads start
        try:
            ids = send_per_channel({ch: pms for ch, (_, pms) in work.items()}, self._send_bodies, max_workers=4)
        except ProduceError as exc:
            for ch, written in getattr(exc, "results", {}).items():
                self._record(ch, work[ch][0], written)
            raise
        for ch, written in ids.items():
            self._record(ch, work[ch][0], written)

    def _send_bodies(self, ch: str, pms: list) -> list:
        """Send one channel's bodies; in a transaction, its BeginTxn first (the bodies' ``_lc``)."""
        if self.wal is not None and self.wal.needs_begin(ch):
            self.wal.began(ch, self._send_one(ch, [self.wal.begin(ch)])[0])
            self.result.channels.setdefault(ch, ChannelStats()).txn_id = self.wal.txns[ch].txn_id
        if self.wal is not None:
            pms = self.wal.with_last_confirmed(ch, pms)
        return self._send_one(ch, pms)

    def _send_one(self, ch: str, pms: list) -> list:
        try:
            return self._producers[ch].send_batch(pms)
        except ProduceError as exc:
            written = sum(1 for i in exc.ids if i is not None)
            raise ProduceError(f"produce to channel {ch} failed: {written} of {len(pms)} message(s) of this "
                               f"flush were written before the error: {exc}", channel=ch,
                               failures=exc.failures, ids=exc.ids) from exc
        except MsgStreamError as exc:
            raise ProduceError(f"produce to channel {ch} failed: {exc}", channel=ch) from exc
        except Exception as exc:  # noqa: BLE001 - client libraries raise anything
            raise ProduceError(f"produce to channel {ch} failed: {type(exc).__name__}: {exc}", channel=ch) from exc

    def _record(self, ch: str, msgs: list[EncodedMessage], ids: list) -> None:
        st = self.result.channels.setdefault(ch, ChannelStats())
        for m in msgs:
            if m.op == OP_INSERT:
                st.inserted += m.rows
            else:
                st.deleted += m.rows
            st.bytes += len(m.payload)
            st.max_ts = max(st.max_ts, m.timestamp)
        st.messages += len(msgs)
        if ids:
            if not st.first_id:
                st.first_id = base64.b64encode(ids[0].serialize()).decode()
            st.last_id = base64.b64encode(ids[-1].serialize()).decode()

    def finish(self) -> None:
        """Flush, then end with a time tick on the sink's channels (``timeTick`` option)."""
        self.flush(wait=True)
        for hook in AFTER_PRODUCE:
            hook(self)
        if self.wal is not None:
            self.end_transactions(commit=True)
        if self.ticks and self.result.channels:
            self.send_ticks(self.opts.channels if self.opts.time_tick == "all" else tuple(self.result.channels))

    def send_ticks(self, chans, after_ts: int = 0) -> None:
        """A time tick above ``after_ts`` and this writer's timestamps on each of ``chans`` (not with timeTick=none)."""
        if self.opts.time_tick == "none" or not chans:
            return
        tt = max(self.clock(), after_ts + 1)
        self.clock.last = tt
        if self.wal is not None:
            pm = self.wal.tick(tt)
        else:
            tick = msg_pb2.TimeTickMsg(base=common_pb2.MsgBase(msg_type=common_pb2.TimeTick, timestamp=tt,
                                                               sourceID=self.opts.source_id))
            pm = ProducerMessage(tick.SerializeToString(), {"msg_type": "TimeTick"}, timestamp=tt)
        self._send_ticks(chans, pm)
        for ch in chans:
            self.result.channels.setdefault(ch, ChannelStats()).time_tick = tt

    def end_transactions(self, commit: bool) -> None:
        """CommitTxn (or RollbackTxn) on every channel whose transaction is open, in channel order."""
        for ch in sorted(self.wal.open_channels()):
            tt = self.clock()
            self._send_one(ch, [self.wal.end(ch, tt, commit, self._keys(0))])
            self.wal.ended(ch, commit)
            st = self.result.channels.setdefault(ch, ChannelStats())
            st.txn, st.max_ts = ("committed" if commit else "rolled_back"), max(st.max_ts, tt)

    def _roll_back(self) -> None:
        """After a failure: RollbackTxn where a transaction is open (best effort; else it expires)."""
        try:
            self.end_transactions(commit=False)
        except Exception as exc:  # noqa: BLE001 - keep the task's own error; readers drop it at expiry
            for ch in self.wal.open_channels():
                self.result.channels.setdefault(ch, ChannelStats()).txn = "open"
            log.warning("could not write RollbackTxn on %s (%s); readers drop the transaction when its "
                        "keepalive of %d ms expires", ", ".join(self.wal.open_channels()), exc,
                        self.opts.txn_keepalive_ms)

    def _send_ticks(self, chans, pm) -> None:
        for ch in chans:
            self._producer(ch)
        for ch in chans:
            self._send_one(ch, [pm])

    def close(self) -> None:
        """Close producers and the client (when owned); keeps the first error."""
        if self._io is not None:
            self._io.shutdown(wait=True)
            self._io = None
            self._inflight = None
        if self.wal is not None and self.wal.open_channels():
            self._roll_back()
        client = self._client if self._own_client else None
        first = close_all(self._producers.values(), *([client.close] if client is not None else []))
        self._producers = {}
        if client is not None:
            self._client = None
        if first is not None:
            log.warning("closing the sink's producers failed: %s", first)
