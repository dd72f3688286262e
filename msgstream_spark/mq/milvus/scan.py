"""Bounded scans of a pchannel: its first and latest messages, and the first at a time tick.

The proxy has no "end of the WAL" call, so ``latest`` is defined by time: the last message that
``DumpMessages`` delivers with a time tick at or below the proxy's TSO when the question is asked
(``Connect``'s identifier, a fresh TSO). The scan ends when the proxy ends the stream at that
``end_timetick``. It reads the pchannel from the last answer cached for it (from its ``_lc``,
exactly as a resume), or from the oldest retained entry the first time. A proxy that stays silent
(an unknown pchannel: Milvus keeps the stream open without a word) fails after
``milvus.requestTimeout``.
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict

from msgstream_spark.errors import BackendTimeoutError, DataLossError
from msgstream_spark.mq.milvus.connection import ProxyConnection
from msgstream_spark.mq.milvus.consumer import MilvusConsumer
from msgstream_spark.mq.milvus.message_id import MilvusMessageID, earliest_for

# The last latest-id answer per (proxy, pchannel, vchannel filter): only where the next scan starts.
# Safe in Spark's reused Python workers: an entry is a hint, any id at or before the true latest
# gives the same answer (a truncated one falls back to a full scan), and eviction costs a longer scan.
CACHE_SIZE = 1024
_cache: OrderedDict[tuple[str, str, frozenset | None], MilvusMessageID] = OrderedDict()
_cache_lock = threading.Lock()


def _remember(key: tuple[str, str, frozenset | None], mid: MilvusMessageID) -> None:
    """Keep ``mid`` for ``key``, dropping the least recently used entries beyond :data:`CACHE_SIZE`."""
    with _cache_lock:
        _cache[key] = mid
        _cache.move_to_end(key)
        while len(_cache) > CACHE_SIZE:
            _cache.popitem(last=False)


def _scan(conn: ProxyConnection, channel: str, vchannels: frozenset[str] | None, start: MilvusMessageID,
          *, inclusive: bool = True, start_tt: int = 0, end_tt: int = 0, first_only: bool = False):
    """Messages delivered from ``start`` until the proxy ends the stream at ``end_tt``."""
    s = conn.settings
    cons = MilvusConsumer(conn, channel, "__msgstream-scan", vchannels=vchannels,
                          start_timetick=start_tt, end_timetick=end_tt)
    try:
        cons.seek(start, inclusive=inclusive)
        quiet_since = time.monotonic()
        while not cons.finished:
            got = cons.receive_batch(1000, 0.5)
            if got:
                quiet_since = time.monotonic()
                yield from got
                if first_only:
                    return
            elif time.monotonic() - quiet_since > s.request_timeout:
                raise BackendTimeoutError(
                    f"Milvus proxy {s.address} sent nothing for pchannel {channel} within milvus.requestTimeout="
                    f"{s.request_timeout:g}s (DumpMessages stays silent on a pchannel the cluster does not have: "
                    "check the name, or use collections)")
    finally:
        cons.close()


def latest_id(conn: ProxyConnection, channel: str, vchannels: frozenset[str] | None) -> MilvusMessageID | None:
    """The last message delivered up to the proxy's current TSO (``None``: the pchannel has none)."""
    key = (conn.settings.address, channel, vchannels)
    with _cache_lock:
        known = _cache.get(key)
    now = conn.fresh_tso()
    last = None
    try:
        start = known or earliest_for(conn.settings.wal)
        for m in _scan(conn, channel, vchannels, start, inclusive=True, end_tt=now):
            last = m.id
    except DataLossError:
        if known is None:
            raise
        with _cache_lock:
            _cache.pop(key, None)
        return latest_id(conn, channel, vchannels)  # the cached id was truncated: scan from the start
    last = last or known
    if last is not None:
        _remember(key, last)
    return last


def first_id(conn: ProxyConnection, channel: str, vchannels: frozenset[str] | None) -> MilvusMessageID | None:
    now = conn.fresh_tso()
    for m in _scan(conn, channel, vchannels, earliest_for(conn.settings.wal), end_tt=now, first_only=True):
        return m.id  # type: ignore[return-value]
    return None


def id_at_timestamp(conn: ProxyConnection, channel: str, vchannels: frozenset[str] | None,
                    hybrid_ts: int) -> MilvusMessageID | None:
    """The first message with a time tick >= ``hybrid_ts`` (the proxy filters by ``start_timetick``)."""
    now = conn.fresh_tso()
    if hybrid_ts > now:
        return None
    for m in _scan(conn, channel, vchannels, earliest_for(conn.settings.wal), start_tt=max(0, int(hybrid_ts)),
                   end_tt=now, first_only=True):
        return m.id  # type: ignore[return-value]
    return None
