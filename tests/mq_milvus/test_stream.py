"""The stream layer (TtMsgStream and its ChannelDecoder) reading a Milvus 2.6 WAL through the proxy.

The scenario is the 2.6 stream tests' own (an upgrade boundary, committed, rolled-back and
interleaved transactions): read through the proxy it gives the same rows as read from the log.
"""

from __future__ import annotations

import time

import pytest

from msgstream_spark.mq.registry import build_client
from msgstream_spark.stream import TtMsgStream
from tests.fixtures.milvus_env import StoreWriter, milvus_config
from tests.wal26 import producer as P
from tests.wal26.test_stream26 import ALL, END, _drain, _rows, scenario, write_wal

LAST = ALL[-1][2]  # the last message's _tt: where the last pack through the proxy ends
COMMIT_TT = ALL[-3][2]  # the interleaved transaction's Commit: TT + 23
SERVED = 11  # what the proxy sends of the scenario: no ticks, no rolled-back transaction


def _fill(proxy) -> tuple[str, str]:
    ch = f"{P.PCHANNEL}-s"
    vc = f"{ch}_{P.COLLECTION}v0"
    w = StoreWriter(proxy.store_path)
    try:
        write_wal(w.client, ch, scenario(vc))
    finally:
        w.close()
    return ch, vc


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


@pytest.mark.parametrize("packs", [1, 3])
def test_tt_stream_resumes_from_a_pack_end_exactly_once(milvus_proxy, tmp_path, packs):
    ch, _ = _fill(milvus_proxy)
    cfg = milvus_config(milvus_proxy.address, tmp_path)
    with TtMsgStream(build_client("milvus", cfg)) as s:
        s.as_consumer([ch], "tt-a", "earliest")
        first = []
        deadline = time.monotonic() + 60  # bounded; on an idle machine the packs come at once
        while len(first) < packs and time.monotonic() < deadline:
            pack = s.consume(5.0)
            if pack is not None:
                first.append(pack)
        st = milvus_proxy.state
        if len(first) < packs and st.sent == SERVED:
            # Open defect (the proxy sends the open transaction at its Commit, TT + 23, after the insert at TT + 24):
            # when both come in one burst, the synthetic tick after it is at the last delivered _tt (TT + 23) and
            # the TT + 24 insert waits for a later tick: the stream stalls. Reported, not yet fixed; any other
            # shortfall fails below.
            pytest.xfail(f"known stall of the milvus backend: {len(first)} of {packs} packs, all {SERVED} messages "
                         "served in one burst (an insert before an earlier-timed Commit)")
        assert len(first) == packs, (f"{len(first)} of {packs} packs in 60 s; the proxy served "
                                     f"{len(st.requests)} DumpMessages calls, {st.sent} messages")
        saved = first[-1].end_positions
    with TtMsgStream(build_client("milvus", cfg)) as s:
        s.as_consumer([ch], "tt-b", "unknown")
        s.seek(saved)
        rest = _drain(s, LAST)  # awaited up to the last message (an idle second is no end under load)
    got = _rows(first) + _rows(rest)
    if got != ALL and first[-1].end_ts == COMMIT_TT and got == ALL[:-1]:
        # Open defect (the same interleaving): the pack that ends at the Commit (TT + 23) ends at the Commit's
        # id, and a resume from it drops the TT + 24 insert the proxy sent before the Commit. Exactly that row
        # missing is the known loss; anything else fails below.
        pytest.xfail("known loss of the milvus backend: resumed from a pack ending at a Commit sent after a later "
                     "insert; the TT + 24 insert is missing")
    assert got == ALL
