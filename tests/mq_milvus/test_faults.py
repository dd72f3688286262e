"""Failures of the milvus backend, injected in the suite's proxy: restart, stall, auth, old proxy, truncation."""

from __future__ import annotations

import threading

import pytest

from msgstream_spark.errors import BackendTimeoutError, BackendUnavailableError, DataLossError, MsgStreamError
from msgstream_spark.mq.milvus.connection import AuthError
from msgstream_spark.mq.registry import build_client
from tests.fixtures.milvus_env import milvus_config, proxy_id
from tests.mq_milvus.test_dump import fill, now_tt, read_all
from tests.wal26 import producer as P

TOKEN = "root:Milvus-s3cret"


def _client(proxy, tmp_path, **kw):
    return build_client("milvus", milvus_config(proxy.address, tmp_path, **kw))


def _workload(n_txn: int = 6) -> list:
    tt, out = now_tt(), []
    for i in range(n_txn):
        t = tt + 10 * i
        out += [P.insert(t, [i]), *P.upsert_txn(t + 1, 700 + i, [i]), P.timetick(t + 8)]
    return out


def test_proxy_restart_mid_stream_loses_nothing_and_repeats_nothing(milvus_proxy, tmp_path):
    built = _workload()
    fill(milvus_proxy, P.PCHANNEL, built)
    expected = len(built) - 6  # the TimeTicks are not sent
    c = _client(milvus_proxy, tmp_path)
    try:
        r = c.reader(P.PCHANNEL)
        r.seek(c.earliest_message_id(), inclusive=True)
        first = read_all(r, 7)
        milvus_proxy.restart()
        rest = read_all(r, expected - 7)
        assert r.receive(0.3) is None
        ids = [m.id for m in first + rest]
        assert len(set(ids)) == len(ids) == expected
        assert [m.properties["_t"] for m in first + rest] == ["2", "900", "3", "2", "901"] * 6
        assert len(milvus_proxy.state.requests) >= 2  # it did reconnect
        r.close()
    finally:
        c.close()


def test_a_proxy_down_for_a_while_is_waited_for_then_reported(milvus_proxy, tmp_path):
    built = _workload(2)
    fill(milvus_proxy, P.PCHANNEL, built)
    c = _client(milvus_proxy, tmp_path, requestTimeout=2)
    try:
        r = c.reader(P.PCHANNEL)
        r.seek(c.earliest_message_id(), inclusive=True)
        first = read_all(r, 3)
        milvus_proxy.stop()
        back = threading.Timer(0.5, milvus_proxy.start)  # the fault: the proxy is away for half a second
        back.start()
        rest = read_all(r, len(built) - 2 - 3)
        back.join()
        assert len({m.id for m in first + rest}) == len(built) - 2
        milvus_proxy.stop()  # and now for good: bounded by milvus.requestTimeout, naming the address
        r.seek(c.earliest_message_id(), inclusive=True)
        with pytest.raises(BackendUnavailableError, match=f"{milvus_proxy.address}.*requestTimeout=2s"):
            read_all(r, 1, timeout=10)
        r.close()
    finally:
        c.close()


def test_a_stalled_stream_is_reopened_after_the_idle_timeout(milvus_proxy, tmp_path):
    built = _workload(3)
    fill(milvus_proxy, P.PCHANNEL, built)
    milvus_proxy.state.stall_after = 4  # the stream goes silent after 4 messages, inside a transaction
    c = _client(milvus_proxy, tmp_path, idleTimeout=0.5)
    try:
        r = c.reader(P.PCHANNEL)
        r.seek(c.earliest_message_id(), inclusive=True)
        got = read_all(r, len(built) - 3)
        assert len({m.id for m in got}) == len(got)
        assert [m.properties["_t"] for m in got] == ["2", "900", "3", "2", "901"] * 3
        assert len(milvus_proxy.state.requests) == 2  # reopened once, after the last whole message
        assert r.receive(0.2) is None  # bounded, not a hang
        r.close()
    finally:
        c.close()


def test_unknown_pchannel_scan_fails_within_the_request_timeout(milvus_proxy, tmp_path):
    c = _client(milvus_proxy, tmp_path, requestTimeout=1)
    try:
        with pytest.raises(BackendTimeoutError, match="pchannel no-such-pchannel.*requestTimeout=1s"):
            c.latest_message_id("no-such-pchannel")
    finally:
        c.close()


def test_credentials_are_required_and_never_shown(milvus_proxy, tmp_path):
    milvus_proxy.state.tokens.add(TOKEN)
    fill(milvus_proxy, P.PCHANNEL, [P.insert(now_tt(), [1])])
    for kw in ({}, {"token": "wrong-s3cret"}, {"user": "root", "password": "bad-s3cret"}):
        c = _client(milvus_proxy, tmp_path, **kw)
        try:
            with pytest.raises(AuthError, match="milvus.token") as info:
                c.latest_message_id(P.PCHANNEL)
            assert "s3cret" not in str(info.value) and "s3cret" not in repr(c)
        finally:
            c.close()
    for kw in ({"token": TOKEN}, {"user": "root", "password": "Milvus-s3cret"}):
        c = _client(milvus_proxy, tmp_path, **kw)
        try:
            assert c.latest_message_id(P.PCHANNEL) is not None
        finally:
            c.close()
    cfg = milvus_config(milvus_proxy.address, tmp_path, token=TOKEN)
    assert "s3cret" not in str(cfg.masked())


def test_unknown_database_is_named(milvus_proxy, tmp_path):
    c = _client(milvus_proxy, tmp_path, database="nodb")
    try:
        with pytest.raises(MsgStreamError, match="database not found\\[database=nodb\\]"):
            c.latest_message_id(P.PCHANNEL)
    finally:
        c.close()


def test_old_proxy_without_dump_messages_names_the_versions(milvus_proxy, tmp_path):
    milvus_proxy.state.unimplemented = True
    c = _client(milvus_proxy, tmp_path)
    try:
        r = c.reader(P.PCHANNEL)
        r.seek(c.earliest_message_id(), inclusive=True)
        with pytest.raises(BackendUnavailableError, match="UNIMPLEMENTED.*Milvus 2.6 proxies built since 2026-03-30"):
            r.receive(5)
    finally:
        c.close()


def test_a_truncated_resume_point_is_data_loss(milvus_proxy, tmp_path):
    built = [P.insert(now_tt() + i, [i]) for i in range(6)] + [P.timetick(now_tt() + 9)]
    ids = fill(milvus_proxy, P.PCHANNEL, built)
    c = _client(milvus_proxy, tmp_path)
    try:
        r = c.reader(P.PCHANNEL)
        r.seek(c.earliest_message_id(), inclusive=True)
        got = read_all(r, 6)
        r.close()
        milvus_proxy.truncate(P.PCHANNEL, ids[3].offset)
        for mid in (got[2].id, proxy_id(ids[2])):  # with resume hints, and a bare id
            r = c.reader(P.PCHANNEL)
            r.seek(c.bytes_to_message_id(mid.serialize()), inclusive=False)
            with pytest.raises(DataLossError, match="no longer in the WAL"):
                read_all(r, 1, timeout=5)
            r.close()
        r = c.reader(P.PCHANNEL)  # what is left is still readable from a retained id
        r.seek(got[4].id, inclusive=False)
        assert [m.id for m in read_all(r, 1)] == [got[5].id]
        r.close()
    finally:
        c.close()


def test_request_validation_errors_come_back_with_milvus_text(milvus_proxy, tmp_path):
    from msgstream_spark.mq.milvus.connection import ProxyConnection, pb_modules
    from msgstream_spark.mq.milvus.settings import MilvusSettings

    common_pb2, milvus_pb2, _ = pb_modules()
    conn = ProxyConnection(MilvusSettings(milvus_config(milvus_proxy.address, tmp_path)))
    try:
        for req, text in ((milvus_pb2.DumpMessagesRequest(), "missing_param=pchannel"),
                          (milvus_pb2.DumpMessagesRequest(pchannel="p"), "missing_param=start_message_id"),
                          (milvus_pb2.DumpMessagesRequest(pchannel="p", start_message_id=common_pb2.MessageID(id="!")),
                           "invalid start_message_id")):
            with pytest.raises(Exception, match=text):
                list(conn.open_stream(req))
    finally:
        conn.close()
