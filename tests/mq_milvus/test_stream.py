"""The stream layer (TtMsgStream and its ChannelDecoder) reading a Milvus 2.6 WAL through the proxy.

The scenario is the 2.6 stream tests' own (an upgrade boundary, committed, rolled-back and
interleaved transactions): read through the proxy it gives the same rows as read from the log.

The proxy sends by ``_tt`` (a transaction at its Commit's), so ids are not increasing: the insert at
TT + 24, written while transaction 33 was open, comes after that transaction's Commit (TT + 23) although
its id is smaller. Where a read pauses is network timing; the proxy's ``pause_after`` knob fixes it, so
each pack end of the scenario is a resume point of its own test, and "exactly once" holds for each.
"""

from __future__ import annotations

import time

import pytest

from msgstream_spark.mq.registry import build_client
from msgstream_spark.stream import TtMsgStream
from tests.fixtures.milvus_env import StoreWriter, milvus_config
from tests.fixtures.waits import wait_until
from tests.wal26 import producer as P
from tests.wal26.test_stream26 import ALL, END, TT, _drain, _rows, scenario, write_wal

LAST = ALL[-1][2]  # the last message's _tt: where the last pack through the proxy ends
SERVED = 11  # what the proxy sends of the scenario: no ticks, no rolled-back transaction
# Every pack end of the scenario: (messages the proxy sent up to it, the pack's end tick). The proxy sends
# I1 (TT - 30, a version-0 entry), I2 (TT + 1), txn 31 (4 messages at TT + 5), txn 33 (4 at its Commit's
# TT + 23), then the TT + 24 insert. After I1 the pack ends at TT - 31: other version-0 entries may share
# its _tt (test_positions.py), so it is left for the next pack.
PACK_ENDS = [(1, TT - 31), (2, TT + 1), (6, TT + 5), (10, TT + 23), (11, TT + 24)]
_IDS = ["after-I1", "after-I2", "after-txn31", "after-txn33-commit", "after-I6"]


def _fill(proxy) -> tuple[str, str]:
    ch = f"{P.PCHANNEL}-s"
    vc = f"{ch}_{P.COLLECTION}v0"
    w = StoreWriter(proxy.store_path)
    try:
        write_wal(w.client, ch, scenario(vc))
    finally:
        w.close()
    return ch, vc


def _packs_to(stream, proxy, end_tt: int, bound: float = 60.0) -> list:
    """Packs until one ends at ``end_tt`` (the proxy paused there, so that pack must come); bounded."""
    packs: list = []
    deadline = time.monotonic() + bound
    while not packs or packs[-1].end_ts < end_tt:
        assert time.monotonic() < deadline, (
            f"no pack ended at TT{end_tt - TT:+d} within {bound:.0f} s; pack ends so far "
            f"{[p.end_ts - TT for p in packs]}, the proxy sent {proxy.state.sent} messages")
        pack = stream.consume(1.0)
        if pack is not None:
            packs.append(pack)
    assert packs[-1].end_ts == end_tt
    return packs


def test_tt_stream_through_the_proxy_gives_the_rows_of_the_log(milvus_proxy, tmp_path):
    ch, _ = _fill(milvus_proxy)
    with TtMsgStream(build_client("milvus", milvus_config(milvus_proxy.address, tmp_path))) as s:
        s.as_consumer([ch], "tt-milvus", "earliest")
        packs = _drain(s, LAST)  # the proxy sends no TimeTick: the last pack ends at the last message's _tt
    assert _rows(packs) == ALL
    with TtMsgStream(build_client("local", _local_config(milvus_proxy))) as s:
        s.as_consumer([ch], "tt-direct", "earliest")
        direct = _drain(s, END)
    assert _rows(direct) == _rows(packs)


def _local_config(proxy):
    from msgstream_spark.config import Config

    return Config.from_dict({"mq": {"type": "local"}, "local": {"path": proxy.store_path}})


def test_the_whole_scenario_in_one_burst_is_one_pack_at_the_last_tt(milvus_proxy, tmp_path):
    """All of it arrives before the reader looks: the synthetic tick after the burst is at the last delivered
    ``_tt`` (the TT + 24 insert, sent after the Commit at TT + 23), so one pack holds every row."""
    ch, _ = _fill(milvus_proxy)
    milvus_proxy.state.pause_after = (0,)  # the stream opens, then waits before its first message
    with TtMsgStream(build_client("milvus", milvus_config(milvus_proxy.address, tmp_path))) as s:
        s.as_consumer([ch], "tt-burst", "earliest")
        assert s.consume(0.2) is None  # opens the stream; nothing sent yet
        stream = s._consumers[ch]._stream  # white box: the entries received and not yet read
        milvus_proxy.state.release()
        wait_until(lambda: stream._q.qsize() >= SERVED, 60, f"the {SERVED} entries of one burst",
                   poll=0.02, seen=lambda: stream._q.qsize())
        pack = s.consume(5.0)
        assert pack is not None and pack.end_ts == LAST
        assert _rows([pack]) == ALL
        assert s.consume(0.3) is None  # nothing held back


@pytest.mark.parametrize(("sent", "end_tt"), PACK_ENDS, ids=_IDS)
def test_tt_stream_resumes_from_every_pack_end_exactly_once(milvus_proxy, tmp_path, sent, end_tt):
    """Seek a new stream to a pack's end positions (Milvus's form: the legacy bytes of an ``_lc`` and the
    tick): the rows before and after are every row, once. From the pack ending at txn 33's Commit this
    lost the TT + 24 insert: the end position was the Commit's own id, which lies after the insert."""
    ch, _ = _fill(milvus_proxy)
    cfg = milvus_config(milvus_proxy.address, tmp_path)
    milvus_proxy.state.pause_after = (sent,)
    with TtMsgStream(build_client("milvus", cfg)) as s:
        s.as_consumer([ch], "tt-a", "earliest")
        first = _packs_to(s, milvus_proxy, end_tt)
        saved = first[-1].end_positions
    with TtMsgStream(build_client("milvus", cfg)) as s:
        s.as_consumer([ch], "tt-b", "unknown")
        s.seek(saved)
        rest = _drain(s, LAST) if end_tt < LAST else []  # awaited up to the last message
        assert s.consume(0.3) is None  # and nothing after it
    assert _rows(first) + _rows(rest) == ALL


@pytest.mark.parametrize(("sent", "end_tt"), PACK_ENDS, ids=_IDS)
def test_named_subscription_resumes_from_every_pack_end_exactly_once(milvus_proxy, tmp_path, sent, end_tt):
    """The same through a named subscription's stored cursor (the last message read, a WAL id with its ``_tt``
    and ``_lc``: the form Spark offsets take), closed right after each pack end."""
    ch, _ = _fill(milvus_proxy)
    cfg = milvus_config(milvus_proxy.address, tmp_path)
    milvus_proxy.state.pause_after = (sent,)
    with TtMsgStream(build_client("milvus", cfg)) as s:
        s.as_consumer([ch], "tt-sub", "earliest")
        first = _packs_to(s, milvus_proxy, end_tt)
    with TtMsgStream(build_client("milvus", cfg)) as s:
        s.as_consumer([ch], "tt-sub", "earliest")  # the stored cursor wins over "earliest"
        rest = _drain(s, LAST) if end_tt < LAST else []
        assert s.consume(0.3) is None
    assert _rows(first) + _rows(rest) == ALL
