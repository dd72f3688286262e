"""The milvus backend against the suite's proxy: Milvus's DumpMessages semantics, collections, same messages.

Entries come from the independent 2.6 test producer (tests/wal26/producer.py), written into the
store the proxy serves; the library reads them back through gRPC.
"""

from __future__ import annotations

import time

import pytest

from msgstream_spark.errors import ChannelNotFoundError, ConfigError, DecodeError, MsgStreamError, ProduceError
from msgstream_spark.mq.milvus.message_id import MilvusMessageID
from msgstream_spark.mq.registry import build_client
from msgstream_spark.msg.wal26 import (
    WalMessageId,
    WalMessageType,
    WALName,
    decode_message,
    time_tick_of,
    vchannel_of,
    wal_position,
)
from msgstream_spark.stream.txn import TxnAssembler
from tests.fixtures.milvus_env import StoreWriter, milvus_config, proxy_id
from tests.milvus_proxy.wal import tso_now
from tests.wal26 import producer as P

WAIT = 20.0
_NOT_SENT = {WalMessageType.Flush, WalMessageType.CreateSegment, WalMessageType.BeginTxn,
             WalMessageType.CommitTxn, WalMessageType.RollbackTxn}


def now_tt(offset_ms: int = 0) -> int:
    return P.tt_of(int(time.time() * 1000) - 60_000 + offset_ms)


def read_all(cons, n: int, timeout: float = WAIT) -> list:
    """``n`` messages the proxy sent (the consumer's synthetic ticks left out)."""
    out: list = []
    deadline = time.monotonic() + timeout
    while len(out) < n and time.monotonic() < deadline:
        out += [m for m in cons.receive_batch(n - len(out), 0.5) if not m.id.tick]
    assert len(out) == n, f"got {len(out)} of {n}"
    return out


def fill(proxy, channel: str, built) -> list:
    w = StoreWriter(proxy.store_path)
    try:
        with w.client.create_producer(channel) as p:
            return P.write(p, built)
    finally:
        w.close()


@pytest.fixture
def client(milvus_proxy, tmp_path):
    c = build_client("milvus", milvus_config(milvus_proxy.address, tmp_path))
    yield c
    c.close()


def _summary(msg, wal_id: WalMessageId) -> tuple:
    if msg is None:
        return ("undecodable",)
    env = msg.wal
    pos = wal_position(env, WALName.RocksMQ, wal_id) if env is not None else None
    proto = getattr(msg, "proto", None)
    return (type(msg).__name__, time_tick_of(msg), vchannel_of(msg), pos,
            proto.SerializeToString() if proto is not None else getattr(msg, "body", b""))


def _decode(payload, props, wal_id):
    try:
        return decode_message(payload, props, channel=P.PCHANNEL, msg_id=None)
    except DecodeError:
        return None


def test_dump_follows_milvus_filters_and_transactions(milvus_proxy, client):
    built = P.every_kind(now_tt())
    fill(milvus_proxy, P.PCHANNEL, built)
    r = client.reader(P.PCHANNEL)
    r.seek(client.earliest_message_id(), inclusive=True)
    got = read_all(r, len(built) - 8)  # 2 TimeTicks, Flush, CreateSegment, the rolled-back txn (4) are not sent
    r.close()
    types = [m.properties["_t"] for m in got]
    assert "1" not in types and "4" not in types and "10" not in types and "902" not in types
    begin = types.index("900")
    assert types[begin:begin + 4] == ["900", "3", "2", "901"]  # an upsert: delete before insert, whole
    commit = got[begin + 3]
    assert {m.properties["_tt"] for m in got[begin:begin + 4]} == {commit.properties["_tt"]}
    assert all(isinstance(m.id, MilvusMessageID) and m.id.wal == WALName.RocksMQ for m in got)
    assert [m.timestamp for m in got] == sorted(m.timestamp for m in got)


def test_same_messages_and_positions_as_reading_the_log_directly(milvus_proxy, client):
    """The proxy's stream and the library's own reading of the same log (decode + TxnAssembler) agree."""
    built = P.every_kind(now_tt(), lc="1") + P.upsert_txn(now_tt(100), 900, [7, 8])
    ids = fill(milvus_proxy, P.PCHANNEL, built)
    direct, asm, own = [], TxnAssembler(), {}
    for b, lid in zip(built, ids):
        msg = _decode(b.payload, b.properties, None)
        if msg is None:
            direct.append(("undecodable",))
            continue
        own[id(msg)] = proxy_id(lid).wal_id
        for out in asm.feed(msg):
            if type(out).__name__ == "TimeTickMsg" or getattr(out, "wal_type", None) in _NOT_SENT:
                continue
            direct.append(_summary(out, own[id(out)]))
    r = client.reader(P.PCHANNEL)
    r.seek(client.earliest_message_id(), inclusive=True)
    through = [_summary(_decode(m.payload, m.properties, None), m.id.wal_id)
               for m in read_all(r, len(built) - 8) if m.properties["_t"] not in ("900", "901")]
    r.close()
    assert through == direct
    assert sum(1 for e in through if len(e) > 3 and e[3] is not None) >= 8  # positions were compared


def test_exclusive_seek_resumes_after_a_delivered_message_exactly_once(milvus_proxy, client):
    built = P.every_kind(now_tt())
    fill(milvus_proxy, P.PCHANNEL, built)
    r = client.reader(P.PCHANNEL)
    r.seek(client.earliest_message_id(), inclusive=True)
    everything = read_all(r, len(built) - 8)
    for cut in (0, 3, 6, len(everything) - 2):
        again = client.reader(P.PCHANNEL)
        again.seek(client.bytes_to_message_id(everything[cut].id.serialize()), inclusive=False)
        rest = read_all(again, len(everything) - cut - 1)
        assert [m.id for m in rest] == [m.id for m in everything[cut + 1:]]
        again.close()
    r.close()


def test_collections_give_pchannels_vchannels_and_only_their_entries(milvus_proxy, tmp_path):
    other_vc = f"{P.PCHANNEL}_999v0"
    milvus_proxy.state.collections[("default", "docs")] = (P.COLLECTION, [P.PCHANNEL], [P.VCHANNEL])
    milvus_proxy.state.collections[("default", "other")] = (999, [P.PCHANNEL], [other_vc])
    tt = now_tt()
    fill(milvus_proxy, P.PCHANNEL, [P.insert(tt, [1]), P.insert(tt + 1, [2], vc=other_vc),
                                    P.create_collection(tt + 2, vc=P.CONTROL_VCHANNEL), P.insert(tt + 3, [3]),
                                    P.timetick(tt + 4)])
    c = build_client("milvus", milvus_config(milvus_proxy.address, tmp_path, collections="default.docs"))
    try:
        assert c.list_channels() == [P.PCHANNEL]
        assert c.collections()[0].to_dict()["vchannels"] == [P.VCHANNEL]
        r = c.reader(P.PCHANNEL)
        r.seek(c.earliest_message_id(), inclusive=True)
        got = read_all(r, 3)
        assert [m.properties["_vc"] for m in got] == [P.VCHANNEL, P.CONTROL_VCHANNEL, P.VCHANNEL]
        assert r.receive(0.3) is None
        r.close()
    finally:
        c.close()
    json_map = build_client("milvus", milvus_config(milvus_proxy.address, tmp_path,
                                                     collections='{"default": ["docs", "other"]}'))
    try:
        assert sorted(x.collection for x in json_map.collections()) == ["docs", "other"]
    finally:
        json_map.close()


def test_unknown_collection_is_a_clear_error(milvus_proxy, tmp_path):
    c = build_client("milvus", milvus_config(milvus_proxy.address, tmp_path, collections="default.nope"))
    try:
        with pytest.raises(ChannelNotFoundError, match="collection 'nope' not found in database 'default'"):
            c.list_channels()
    finally:
        c.close()
    c = build_client("milvus", milvus_config(milvus_proxy.address, tmp_path))
    try:
        with pytest.raises(ConfigError, match="milvus.collections"):
            c.list_channels()
    finally:
        c.close()


def test_read_only_backend_names_the_backends_to_write_to(client):
    with pytest.raises(ProduceError, match="read-only.*kafka, pulsar or local"):
        client.create_producer(P.PCHANNEL)


def test_latest_first_and_timestamp_lookups(milvus_proxy, client):
    tt = now_tt()
    built = [P.insert(tt + i, [i]) for i in range(5)] + [P.timetick(tt + 9)]
    ids = fill(milvus_proxy, P.PCHANNEL, built)
    assert client.latest_message_id(P.PCHANNEL) == proxy_id(ids[4])
    assert client.first_message_id(P.PCHANNEL) == proxy_id(ids[0])
    assert client.message_id_at_timestamp(P.PCHANNEL, tt + 2) == proxy_id(ids[2])
    # every scan above persisted a TimeTick at the proxy's TSO, as Milvus does: a new entry comes after them
    new = fill(milvus_proxy, P.PCHANNEL, [P.insert(tso_now() + 1, [9])])
    assert client.latest_message_id(P.PCHANNEL) == proxy_id(new[0])  # the cached scan goes on


def test_bad_ids_are_decode_errors(client):
    with pytest.raises(MsgStreamError, match="not a Milvus WAL message id"):
        client.bytes_to_message_id(b"\xff\xff")
    mid = MilvusMessageID(WalMessageId(WALName.Kafka, "rs"), 5, "rr")
    back = client.bytes_to_message_id(mid.serialize())
    assert back == mid and back.time_tick == 5 and back.last_confirmed == "rr" and back.offset == 1000
    legacy = client.bytes_to_message_id((1000).to_bytes(8, "little"))  # a MsgPosition's msgID (Kafka/RocksMQ form)
    assert legacy.offset == 1000 and legacy.id == "rs"
    # 0x060a: bytes 0a 06 00.. also parse as a common.MessageID (field 1, six NULs): still the legacy offset
    assert client.bytes_to_message_id((0x060A).to_bytes(8, "little")).offset == 0x060A


def test_the_latest_id_cache_is_bounded(milvus_proxy, client, monkeypatch):
    """The process-wide cache of latest ids (scan.py) keeps the most recently used entries only."""
    from msgstream_spark.mq.milvus import scan

    monkeypatch.setattr(scan, "CACHE_SIZE", 3)
    monkeypatch.setattr(scan, "_cache", type(scan._cache)())
    chans = [f"bounded-{i}" for i in range(5)]
    last = {}
    for ch in chans:
        tt = tso_now()
        last[ch] = fill(milvus_proxy, ch, [P.insert(tt, [1]), P.timetick(tt + 1)])[0]
        assert client.latest_message_id(ch) == proxy_id(last[ch])
    assert [k[1] for k in scan._cache] == chans[2:]
    assert client.latest_message_id(chans[0]) == proxy_id(last[chans[0]])  # evicted: a full scan, same answer
    assert [k[1] for k in scan._cache] == [*chans[3:], chans[0]]


def test_a_cached_latest_id_from_another_wal_at_the_same_address_is_not_trusted(milvus_proxy, tmp_path):
    """The latest-id cache is keyed by address: a proxy at the same address serving another WAL (a restarted
    cluster, or the suite's next proxy on a reused port) must get its own answer, not the old one."""
    from tests.milvus_proxy.server import MilvusProxy, ProxyState

    ch = "reused-address"
    tt = tso_now() - (1000 << 18)  # a second ago: every tick below the proxy's TSO when asked
    old = fill(milvus_proxy, ch, [m for i in range(6) for m in (P.insert(tt + 2 * i, [i]), P.timetick(tt + 2 * i + 1))])
    with build_client("milvus", milvus_config(milvus_proxy.address, tmp_path)) as c:
        assert c.latest_message_id(ch) == proxy_id(old[-2])  # cached: the last insert (ticks are not served)
    port = milvus_proxy.port
    milvus_proxy.stop()
    other = MilvusProxy(str(tmp_path / "other-wal.db"), ProxyState())
    other.port = port  # the same address, another WAL
    other.start()
    try:
        tt = tso_now() - (1000 << 18)
        new = fill(other, ch, [P.insert(tt, [1]), P.timetick(tt + 1), P.insert(tt + 2, [2]), P.timetick(tt + 3)])
        with build_client("milvus", milvus_config(other.address, tmp_path / "o")) as c:
            assert c.latest_message_id(ch) == proxy_id(new[-2])  # the new WAL's last insert, not the old one
    finally:
        other.stop()


def test_a_bare_id_and_a_delivered_one_compare_as_positions():
    """Delivered ids (with ``_tt``) order as the proxy sends them, by ``_tt``; a bare id (a position's legacy
    bytes) is a position, and a delivered id compared with one stands for its own position, its ``_lc``."""
    def rocks(offset: int, tt: int | None = None, lc: int | None = None) -> MilvusMessageID:
        return MilvusMessageID(WalMessageId(WALName.RocksMQ, P.b36(offset)), tt, None if lc is None else P.b36(lc))

    commit, insert = rocks(11, tt=23, lc=2), rocks(9, tt=24, lc=2)  # an insert written while the txn was open
    assert commit < insert and sorted([insert, commit]) == [commit, insert]  # delivery order
    assert rocks(1) < insert and rocks(1) < commit and insert < rocks(3) and commit < rocks(3)  # their _lc: 2
    assert not rocks(2) < commit and rocks(2) <= commit and rocks(2) >= commit  # at the first one's _lc: no loss
    assert rocks(11) == commit and not rocks(11) < commit and not commit < rocks(11)  # the entry itself
    assert rocks(4, tt=5) < rocks(5) and not rocks(4, tt=5) > rocks(4)  # no _lc: its own id
    assert rocks(9) < rocks(10)  # bare ids by WAL position
