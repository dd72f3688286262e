"""Milvus 2.6 transactions, assembled as Milvus's consumers do (wal doc §5).

A transaction is separate broker entries on one vchannel, all carrying ``_tx``: BeginTxn,
bodies, then CommitTxn or RollbackTxn. :class:`TxnAssembler` buffers the bodies and releases
them only at the commit, re-timed to the commit's ``_tt`` and ``_lc``; a rollback drops them,
and so does expiry: once a TimeTick's ``_tt`` reaches the last body's ``_tt`` (the Begin's if
none) plus the keepalive (milliseconds, added to the physical part: ``+ (ms << 18)``). A later
Commit of a closed transaction, and bodies of a transaction never begun, are ignored. Use one
assembler per pchannel, fed in broker order. It depends only on the msg layer.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from dataclasses import dataclass, field

from msgstream_spark.msg.tso import LOGICAL_BITS
from msgstream_spark.msg.types import TsMsg
from msgstream_spark.msg.wal26 import WalMessageType, with_time_tick

DEFAULT_KEEPALIVE_MS = 10_000  # the streamingnode's default when a context says 0
_CLOSED_MEMORY = 65_536  # closed transaction ids remembered, to ignore their late messages
T = WalMessageType


@dataclass
class OpenTxn:
    """A transaction whose Begin was seen and whose end was not (yet)."""

    txn_id: int
    vchannel: str | None
    begin: TsMsg
    keepalive_ms: int  # negative: never expires (replicated transactions use -1000)
    last_tt: int
    bodies: list[TsMsg] = field(default_factory=list)

    @property
    def deadline(self) -> int | None:
        """The time tick at which a TimeTick expires this transaction (None: never)."""
        if self.keepalive_ms < 0:
            return None
        return self.last_tt + (self.keepalive_ms << LOGICAL_BITS)


class TxnAssembler:
    """Feed messages of one pchannel in order; get back what a Milvus consumer would apply.

    ``emit_control`` also releases the Begin and Commit (at the commit) and the Begin and
    Rollback (at the rollback) around the bodies, for a messages view. ``stats`` counts
    committed, rolled_back, expired and ignored transactions / messages.
    """

    def __init__(self, *, emit_control: bool = False, default_keepalive_ms: int = DEFAULT_KEEPALIVE_MS) -> None:
        self.emit_control = emit_control
        self.default_keepalive_ms = int(default_keepalive_ms)
        self._open: dict[int, OpenTxn] = {}
        self._closed: OrderedDict[int, str] = OrderedDict()
        self.stats: Counter[str] = Counter()

    # -- queries -------------------------------------------------------------------------------------
    @property
    def has_open(self) -> bool:
        """True while some transaction is open: a batch must not end here."""
        return bool(self._open)

    def open_transactions(self) -> list[OpenTxn]:
        """Open transactions, oldest Begin first (where a reader must resume to see them whole)."""
        return list(self._open.values())

    def oldest_open(self) -> OpenTxn | None:
        return next(iter(self._open.values()), None)

    def outcome(self, txn_id: int) -> str | None:
        """``committed`` / ``rolled_back`` / ``expired`` for a recently closed transaction, else None."""
        return self._closed.get(txn_id)

    # -- feeding -------------------------------------------------------------------------------------
    def feed(self, msg: TsMsg) -> list[TsMsg]:
        """Take the next message; return the messages it releases, in order."""
        env = msg.wal
        if env is None:  # a 2.5 message: no transactions
            return [msg]
        if env.txn is None:
            if env.msg_type == T.TimeTick:
                self.expire(env.time_tick)
            return [msg]
        t = env.msg_type
        if t == T.BeginTxn:
            return self._begin(msg)
        if t == T.CommitTxn:
            return self._commit(msg)
        if t == T.RollbackTxn:
            return self._rollback(msg)
        return self._body(msg)

    def feed_all(self, msgs) -> list[TsMsg]:
        out: list[TsMsg] = []
        for m in msgs:
            out.extend(self.feed(m))
        return out

    def expire(self, time_tick: int) -> list[int]:
        """Drop every open transaction whose deadline is <= ``time_tick``; return their ids."""
        gone = [t.txn_id for t in self._open.values() if t.deadline is not None and time_tick >= t.deadline]
        for txn_id in gone:
            self._close(txn_id, "expired")
        return gone

    def _begin(self, msg: TsMsg) -> list[TsMsg]:
        env = msg.wal
        txn_id = env.txn.txn_id
        if txn_id in self._open or txn_id in self._closed:
            self.stats["ignored_messages"] += 1  # a duplicate Begin
            return []
        keepalive = env.txn.keepalive_milliseconds or self.default_keepalive_ms
        self._open[txn_id] = OpenTxn(txn_id, env.vchannel, msg, keepalive, env.time_tick)
        return []

    def _body(self, msg: TsMsg) -> list[TsMsg]:
        txn = self._open.get(msg.wal.txn.txn_id)
        if txn is None:  # never begun here, or already expired / closed
            self.stats["ignored_messages"] += 1
            return []
        txn.bodies.append(msg)
        txn.last_tt = max(txn.last_tt, msg.wal.time_tick)
        return []

    def _commit(self, msg: TsMsg) -> list[TsMsg]:
        txn = self._open.get(msg.wal.txn.txn_id)
        if txn is None:
            self.stats["ignored_messages"] += 1
            return []
        self._close(txn.txn_id, "committed")
        bodies = [with_time_tick(b, msg.wal, msg.position) for b in txn.bodies]
        return [txn.begin, *bodies, msg] if self.emit_control else bodies

    def _rollback(self, msg: TsMsg) -> list[TsMsg]:
        txn = self._open.get(msg.wal.txn.txn_id)
        if txn is None:
            self.stats["ignored_messages"] += 1
            return []
        self._close(txn.txn_id, "rolled_back")
        return [txn.begin, msg] if self.emit_control else []

    def _close(self, txn_id: int, outcome: str) -> None:
        self._open.pop(txn_id, None)
        self._closed[txn_id] = outcome
        if len(self._closed) > _CLOSED_MEMORY:
            self._closed.popitem(last=False)
        self.stats[outcome] += 1
