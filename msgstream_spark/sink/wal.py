"""The sink's Milvus 2.6 format (``wireFormat=2.6``): WAL properties, and transactions per task.

Every message gets the properties a 2.6 streamingnode writes (:mod:`msgstream_spark.msg.wal26.encode`):
``_v``, ``_t``, ``_tt`` (the message's own timestamp), ``_vc`` (the shard's vchannel), ``_h`` (an
Insert assigns segment ``partitionID + shard``, the id the 2.5 format writes in the body).

``_lc`` (where a reader resumes to see the message again) needs the broker id of a message
already written, which a producer learns only on acknowledgement. So a message outside a
transaction carries ``_lcs`` (its own id, the position a 2.5 message gets), and with
``transactional=true`` a task writes, per channel, a BeginTxn (``_lcs``) first, waits for its id,
and gives every body and the CommitTxn / RollbackTxn ``_lc`` = that id: resuming from any of
them re-reads the whole transaction, as Milvus requires.

With transactions the exactly-once keys (``msgstream.writer``/``batch``/``task``/``seq``) move
from the bodies to the CommitTxn: a reader that applies ``ReplayFilter`` in broker order drops the
Commit of a replayed batch (its bodies then expire), while the retry of a task that never
committed is a first delivery.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from msgstream_spark.mq.base import ProducerMessage
from msgstream_spark.msg.wal26 import WalMessageId, WALName
from msgstream_spark.msg.wal26 import encode as wal
from msgstream_spark.sink.options import SinkOptions

# Which WAL id form a backend's message ids take (wal doc §4; the embedded log's int64 ids are RocksMQ-like).
WAL_OF_BACKEND = {"kafka": WALName.Kafka, "pulsar": WALName.Pulsar, "local": WALName.RocksMQ}
OP_INSERT = 0


@dataclass
class ChannelTxn:
    """One task's transaction on one channel."""

    txn_id: int
    shard: int
    begin_id: str | None = None  # WAL id string of the acknowledged BeginTxn: the bodies' _lc
    state: str = "new"  # new -> open -> committed | rolled_back


class WalFormat:
    """Builds the 2.6 messages of one write task (plain data, no I/O)."""

    def __init__(self, opts: SinkOptions, mq_type: str, begin_tt: int) -> None:
        self.opts = opts
        self.wal = WAL_OF_BACKEND.get(mq_type, WALName.Unknown)
        self.begin_tt = begin_tt  # below every body's timestamp: the task's clock started here
        self.transactional = opts.transactional
        self.txns: dict[str, ChannelTxn] = {}

    # -- per message ------------------------------------------------------------------------------
    def body_properties(self, m, keys: dict[str, str]) -> dict[str, str]:
        """WAL properties of an encoded Insert/Delete (``m``: an ``EncodedMessage``)."""
        o = self.opts
        vc = o.vchannels[m.shard]
        if m.op == OP_INSERT:
            p = wal.insert_properties(m.timestamp, vc, o.collection_id, o.partition_id, rows=m.rows,
                                      binary_size=len(m.payload), segment_id=self.segment_id(m.shard),
                                      last_confirmed_self=not self.transactional)
        else:
            p = wal.delete_properties(m.timestamp, vc, o.collection_id, rows=m.rows,
                                      last_confirmed_self=not self.transactional)
        if not self.transactional:
            p.update(keys)
            return p
        txn = self.txn(o.channels[m.shard], m.shard)
        return wal.in_txn(p, txn.txn_id, o.txn_keepalive_ms)

    def segment_id(self, shard: int) -> int:
        """The segment an Insert of ``shard`` is assigned to (the 2.5 format's body segmentID)."""
        return self.opts.partition_id + shard

    def tick(self, time_tick: int) -> ProducerMessage:
        payload, props = wal.timetick(time_tick, source_id=self.opts.source_id, last_confirmed_self=True)
        return ProducerMessage(payload, props, timestamp=time_tick)

    # -- transactions -----------------------------------------------------------------------------
    def txn(self, channel: str, shard: int) -> ChannelTxn:
        """This task's transaction on ``channel`` (a fresh random id per task attempt)."""
        t = self.txns.get(channel)
        if t is None:
            t = self.txns[channel] = ChannelTxn(secrets.randbits(62) + 1, shard)
        return t

    def needs_begin(self, channel: str) -> bool:
        t = self.txns.get(channel)
        return t is not None and t.state == "new"

    def begin(self, channel: str) -> ProducerMessage:
        t = self.txns[channel]
        payload, props = wal.begin_txn(self.begin_tt, self.opts.vchannels[t.shard], t.txn_id,
                                       self.opts.txn_keepalive_ms, last_confirmed_self=True)
        return ProducerMessage(payload, props, timestamp=self.begin_tt)

    def began(self, channel: str, msg_id) -> None:
        """Record the acknowledged BeginTxn's broker id; later messages of the txn point at it."""
        t = self.txns[channel]
        t.begin_id = WalMessageId.from_legacy_bytes(self.wal, msg_id.serialize()).id
        t.state = "open"

    def with_last_confirmed(self, channel: str, pms: list[ProducerMessage]) -> list[ProducerMessage]:
        t = self.txns.get(channel)
        if t is None or t.begin_id is None:
            return pms
        return [ProducerMessage(pm.payload, {**pm.properties, "_lc": t.begin_id}, pm.timestamp) for pm in pms]

    def open_channels(self) -> list[str]:
        """Channels whose transaction began and has not ended."""
        return [ch for ch, t in self.txns.items() if t.state == "open"]

    def end(self, channel: str, time_tick: int, commit: bool, keys: dict[str, str]) -> ProducerMessage:
        """The CommitTxn (carrying the exactly-once ``keys``) or RollbackTxn of ``channel``."""
        t = self.txns[channel]
        build = wal.commit_txn if commit else wal.rollback_txn
        payload, props = build(time_tick, self.opts.vchannels[t.shard], t.txn_id, self.opts.txn_keepalive_ms,
                               last_confirmed=t.begin_id)
        if commit:
            props.update(keys)
        return ProducerMessage(payload, props, timestamp=time_tick)

    def ended(self, channel: str, commit: bool) -> None:
        self.txns[channel].state = "committed" if commit else "rolled_back"
