"""Driver-side planning for Milvus 2.6 channels: scan items from properties, and safe cuts.

A micro-batch must never end while a 2.6 transaction is open, or its bodies would be split
from their commit (a task starting after the Begin drops them). The scanner feeds each
channel's messages, by their properties only, to a :class:`TxnAssembler` (the same one the
read tasks use, so rollback and expiry agree) and marks each item ``safe`` when no transaction
is open after it. :func:`settle_cut` then moves a planned cut to a safe item: forward to the
end of the transaction when the uncapped plan reaches it (``maxRowsPerTrigger`` yields), else
back to before its Begin (the transaction waits for the next batch).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from msgstream_spark.errors import DecodeError
from msgstream_spark.msg.types import MsgType
from msgstream_spark.msg.wal26 import WalMessageType, WalMsg, is_wal_message, parse_envelope
from msgstream_spark.stream.ticks import Item
from msgstream_spark.stream.txn import TxnAssembler

# InsertRequest.num_rows = 14, DeleteRequest.num_rows = 11
_ROWS_FIELD = {WalMessageType.Insert: MsgType.Insert, WalMessageType.Delete: MsgType.Delete}


@dataclass
class ScanItem(Item):
    """A scanned message plus whether a batch may end right after it (no transaction open)."""

    safe: bool = True


def wal_item(m: Any, output: str, txns: TxnAssembler, peek_counts: Any) -> ScanItem | None:
    """The scan item of a 2.6 message (time = ``_tt``), or None for a 2.5 one (no ``_v``, or version 0)."""
    props = m.properties
    if not is_wal_message(props):
        return None
    try:
        env = parse_envelope(props)
    except DecodeError:  # the read task decides (onDecodeError); the driver only plans
        return ScanItem(m.id, 0, False, 1 if output == "messages" else 0, len(m.payload), not txns.has_open)
    txns.feed(WalMsg(env, b""))  # properties are all the assembler looks at
    rows = 0
    if output == "messages":
        rows = 1
    elif env.msg_type in _ROWS_FIELD and env.version == 1 and not env.is_control_vchannel and env.cipher is None:
        rows = peek_counts(m.payload, _ROWS_FIELD[env.msg_type])[0]
    tick = env.msg_type == WalMessageType.TimeTick
    return ScanItem(m.id, env.time_tick, tick, rows, len(m.payload), not txns.has_open)


def _ok(items: Sequence[Item], k: int, aligned: bool) -> bool:
    """Whether a batch may take the first ``k`` items: none open a transaction, ticks where aligned."""
    if k == 0:
        return True
    last = items[k - 1]
    return getattr(last, "safe", True) and (not aligned or last.tick)


def settle_cut(views: Mapping[str, Sequence[Item]], aligned: set[str], chosen: dict[str, int],
               reach: Mapping[str, int]) -> dict[str, int]:
    """``chosen`` with every cut that falls inside an open transaction moved to a safe item.

    Forward (up to ``reach``, the uncapped plan) to the first safe item after the cut, else back
    to the last safe item before it. Channels without 2.6 transactions are unchanged.
    """
    out = dict(chosen)
    for ch, n in chosen.items():
        items = views[ch]
        if _ok(items, n, False):
            continue
        al = ch in aligned
        ahead = next((k for k in range(n + 1, reach.get(ch, n) + 1) if _ok(items, k, al)), None)
        out[ch] = ahead if ahead is not None else max(k for k in range(n + 1) if _ok(items, k, al))
    return out
