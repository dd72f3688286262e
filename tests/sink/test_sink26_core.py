"""The sink's Milvus 2.6 format without Spark: options, messages, transactions, rollback, a killed task, CLI.

Everything written is read back as a 2.6 consumer applies it (tests/sink/wal26_read.py:
ReplayFilter, wal26.decode_message, TxnAssembler).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from msgstream_spark.config import Config
from msgstream_spark.errors import OptionError
from msgstream_spark.mq.registry import build_client
from msgstream_spark.msg import tso
from msgstream_spark.msg.wal26 import WalMessageId, parse_envelope
from msgstream_spark.sink import task
from msgstream_spark.sink.dedupe import PROP_WRITER
from msgstream_spark.sink.options import parse_sink_options
from msgstream_spark.sink.plan import plan_write
from msgstream_spark.sink.task import TaskWriter
from tests.fixtures.login_env import login_env
from tests.sink import failpoint
from tests.sink.helpers import config_file
from tests.sink.wal26_read import apply, raw_messages

ROOT = Path(__file__).resolve().parents[2]


def _batch(pks, ops=None):
    n = len(pks)
    vals = (np.arange(n * 2, dtype=np.float32) / 4).reshape(n, 2)
    cols = {"pk": pa.array(pks, pa.int64()), "title": pa.array([f"t{p}" for p in pks]),
            "vec": pa.array([list(map(float, v)) for v in vals], pa.list_(pa.float32()))}
    if ops is not None:
        cols = {"op": pa.array(ops), **cols}
    return pa.RecordBatch.from_pydict(cols)


def _writer(cfg: str, chans, **opts):
    o = parse_sink_options({"config": cfg, "channels": ",".join(chans), "collectionID": "449",
                            **{k: str(v) for k, v in opts.items()}})
    return o, TaskWriter(o, plan_write(_batch([1]).schema, o))


def test_wire_format_options_are_validated(local_env, tmp_path):
    cfg = config_file(local_env, tmp_path)
    with pytest.raises(OptionError, match="option wireFormat must be 2.5 .* or 2.6 .*got '2.7'"):
        parse_sink_options({"config": cfg, "channels": "a", "wireFormat": "2.7"})
    with pytest.raises(OptionError, match="transactional=true needs wireFormat=2.6.*wireFormat=2.5"):
        parse_sink_options({"config": cfg, "channels": "a", "transactional": "true"})
    with pytest.raises(OptionError, match="option transactional must be true or false"):
        parse_sink_options({"config": cfg, "channels": "a", "wireFormat": "2.6", "transactional": "maybe"})
    with pytest.raises(OptionError, match="txnKeepalive applies only with transactional=true"):
        parse_sink_options({"config": cfg, "channels": "a", "wireFormat": "2.6", "txnKeepalive": "5"})
    with pytest.raises(OptionError, match="txnKeepalive must be >= 1"):
        parse_sink_options({"config": cfg, "channels": "a", "wireFormat": "2.6", "transactional": "1",
                            "txnKeepalive": "0"})
    o = parse_sink_options({"config": cfg, "channels": "a", "wireFormat": "2.6", "transactional": "true"})
    assert (o.wire_format, o.transactional, o.txn_keepalive_ms) == ("2.6", True, 10_000)


def test_2_6_messages_decode_to_the_same_requests_as_2_5(tmp_path, monkeypatch):
    """Same rows, same clock, same writer: a 2.6 topic gives byte-identical Insert/Delete protos."""
    monkeypatch.setattr(tso, "now", lambda logical=0: 1 << 60)  # a frozen clock: the task's timestamps repeat
    decoded = {}
    for fmt in ("2.5", "2.6"):
        env_cfg = Config.from_dict({"mq": {"type": "local"}, "local": {"path": str(tmp_path / f"{fmt}.db")}})
        cfg = tmp_path / f"{fmt}.yaml"
        cfg.write_text(json.dumps({"mq.type": "local", "local.path": env_cfg.values["local.path"]}))
        chans = ["own-dml_0", "own-dml_1"]
        o, w = _writer(str(cfg), chans, wireFormat=fmt, writerId="same", partitionID=900)
        w.write_batches([_batch(list(range(20)), ["insert"] * 15 + ["delete"] * 5)])
        with build_client("local", env_cfg) as c:
            got = apply(c, chans)
        decoded[fmt] = [(type(m).__name__, m.proto.SerializeToString()) for ch in chans for m in got.msgs[ch]
                        if type(m).__name__ in ("InsertMsg", "DeleteMsg")]
        if fmt == "2.6":
            for i, ch in enumerate(chans):
                assert got.types(ch)[-1] == "TimeTick" and "_vc" not in got.raw[ch][-1].properties
                for m in got.raw[ch][:-1]:
                    env = parse_envelope(m.properties)
                    assert env.vchannel == f"{ch}_449v{i}" and env.last_confirmed_self
                    assert "msg_type" not in m.properties
                    assert m.properties[PROP_WRITER] == "same"
                    if env.type_name == "Insert":
                        part = env.header_fields["partitions"][0]
                        assert part["segment_assignment"]["segment_id"] == 900 + i
                        assert part["binary_size"] == len(m.payload)
    assert decoded["2.5"] == decoded["2.6"] and len(decoded["2.6"]) >= 4


def test_round_trip_on_every_backend_with_transactions(backend, tmp_path):
    chans = [backend.new_channel("t26") for _ in range(2)]
    cfg = config_file(backend, tmp_path)
    o, w = _writer(cfg, chans, wireFormat="2.6", transactional="true", bufferBytes=1)  # a flush per batch
    w.write_batches([_batch(list(range(0, 30))), _batch(list(range(30, 60))), _batch([5, 6], ["delete"] * 2)])
    with backend.client() as c:
        got = apply(c, chans)
    assert sorted(r["pk"] for r in got.rows()) == list(range(60)) and got.violations == 0
    assert sorted(got.deleted()) == [5, 6]
    for ch in chans:
        types = got.types(ch)
        assert types[0] == "BeginTxn" and types[-2:] == ["CommitTxn", "TimeTick"]
        assert set(types[1:-2]) <= {"Insert", "Delete"} and got.assemblers[ch].stats["committed"] == 1
        begin_lc = WalMessageId.from_legacy_bytes(w.wal.wal, got.raw[ch][0].id.serialize()).id
        assert parse_envelope(got.raw[ch][0].properties).last_confirmed_self
        for m in got.raw[ch][1:-1]:  # bodies and the commit: _lc = the Begin's id
            assert parse_envelope(m.properties).last_confirmed == begin_lc
        bodies = got.msgs[ch][:-1]  # then the closing TimeTick
        commit_tt = parse_envelope(got.raw[ch][-2].properties).time_tick
        assert {int(t) for b in bodies for t in b.timestamps} == {commit_tt}  # applied at the commit's _tt
        assert w.result.channels[ch].txn == "committed"


def test_a_task_failing_after_producing_rolls_back_and_its_retry_counts_once(local_env, tmp_path, monkeypatch):
    chans = [local_env.new_channel("rb") for _ in range(2)]
    cfg = config_file(local_env, tmp_path)

    def boom(writer):
        raise RuntimeError("injected failure after producing")

    monkeypatch.setattr(task, "AFTER_PRODUCE", [boom])
    o, w = _writer(cfg, chans, wireFormat="2.6", transactional="true", writerId="rb")
    with pytest.raises(RuntimeError, match="injected"):
        w.write_batches([_batch(list(range(40)))])
    assert {s.txn for s in w.result.channels.values()} == {"rolled_back"}
    with local_env.client() as c:
        first = apply(c, chans)
    assert first.rows() == [] and all(first.types(ch)[-1] == "RollbackTxn" for ch in chans)
    monkeypatch.setattr(task, "AFTER_PRODUCE", [])
    o, retry = _writer(cfg, chans, wireFormat="2.6", transactional="true", writerId="rb")  # same keys
    retry.write_batches([_batch(list(range(40)))])
    o, replay = _writer(cfg, chans, wireFormat="2.6", transactional="true", writerId="rb")  # a committed replay
    replay.write_batches([_batch(list(range(40)))])
    with local_env.client() as c:
        got = apply(c, chans)
    assert sorted(r["pk"] for r in got.rows()) == list(range(40))  # the rollback's and the replay's rows: none
    assert got.replays_dropped == 2  # the replay's CommitTxn per channel; its bodies stay open until expiry
    assert sum(a.stats["rolled_back"] for a in got.assemblers.values()) == 2
    assert all(a.has_open for a in got.assemblers.values())


def test_a_killed_task_leaves_a_transaction_that_expires(local_env, tmp_path):
    """SIGKILL-like death (os._exit after producing): no Rollback; a later TimeTick past the keepalive drops it."""
    chans = [local_env.new_channel("kill") for _ in range(2)]
    cfg = config_file(local_env, tmp_path)
    marker = tmp_path / "killed.marker"
    env = {**login_env(), "PYTHONPATH": str(ROOT), failpoint.ENV: str(marker)}
    code = ("import sys, pyarrow as pa; from tests.sink import failpoint, test_sink26_core as t; "
            "failpoint.install(sys.argv[2]); o, w = t._writer(sys.argv[1], sys.argv[3].split(','), "
            "wireFormat='2.6', transactional='true', txnKeepalive='1', writerId='k'); "
            "w.write_batches([t._batch(list(range(25)))])")
    run = subprocess.run([sys.executable, "-c", code, cfg, str(marker), ",".join(chans)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=120)
    assert run.returncode == 17 and marker.exists(), run.stderr[-2000:]
    with local_env.client() as c:
        killed = apply(c, chans)
    assert killed.rows() == [] and all(a.has_open for a in killed.assemblers.values())
    assert all("RollbackTxn" not in killed.types(ch) and "CommitTxn" not in killed.types(ch) for ch in chans)
    o, retry = _writer(cfg, chans, wireFormat="2.6", transactional="true", txnKeepalive=1, writerId="k")
    retry.write_batches([_batch(list(range(25)))])  # its closing TimeTick is past the killed txn's keepalive
    with local_env.client() as c:
        got = apply(c, chans)
    assert sorted(r["pk"] for r in got.rows()) == list(range(25))
    for a in got.assemblers.values():
        assert (a.stats["expired"], a.stats["committed"], a.has_open) == (1, 1, False)


def test_cli_publish_wire_format_2_6(local_env, tmp_path, capsys):
    from msgstream_spark.cli.main import main

    cfg = config_file(local_env, tmp_path)
    chans = [local_env.new_channel("cli26") for _ in range(2)]
    code = main(["publish", "--config", cfg, "-c", ",".join(chans), "--synthetic", "120", "--dim", "4",
                 "--delete-fraction", "0.1", "--batch-rows", "50", "--wire-format", "2.6", "--transactional",
                 "--no-progress"])
    out, err = capsys.readouterr()
    assert code == 0, err
    summary = json.loads(out.splitlines()[-1])
    assert summary["inserted"] == 120 and {c["txn"] for c in summary["channels"].values()} == {"committed"}
    with local_env.client() as c:
        got = apply(c, chans)
        assert raw_messages(c, chans[0])[0].properties["_t"] == "900"
    assert sorted(r["pk"] for r in got.rows()) == list(range(120))
    assert sorted(got.deleted()) == list(range(0, 120, 10))


def test_concurrent_tasks_leave_the_closing_ticks_to_the_driver(local_env, tmp_path):
    """Why Spark tasks send no 2.6 TimeTick: one task's tick would drop another's later-produced rows."""
    cfg = config_file(local_env, tmp_path)
    for ticks, want_violations in ((True, True), (False, False)):
        ch = local_env.new_channel("tick")
        (_, a), (_, b) = _writer(cfg, [ch], wireFormat="2.6"), _writer(cfg, [ch], wireFormat="2.6")
        a.ticks = b.ticks = ticks
        b.add(_batch(list(range(100, 110))))  # encoded (timestamped) but not yet produced
        a.write_batches([_batch(list(range(10)))])  # produced, then (with ticks) a TimeTick above b's rows
        b.write_batches([])
        if not ticks:  # what MsgStreamArrowWriter.commit does on the driver
            o, driver = _writer(cfg, [ch], wireFormat="2.6")
            driver.send_ticks([ch], after_ts=max(w.result.channels[ch].max_ts for w in (a, b)))
            driver.close()
        with local_env.client() as c:
            got = apply(c, [ch])
        assert (got.violations > 0) == want_violations
        assert (sorted(r["pk"] for r in got.rows()) == [*range(10), *range(100, 110)]) != want_violations


def test_the_library_s_channel_decoder_reads_the_sink_s_2_6_output(local_env, tmp_path):
    """stream.decode.ChannelDecoder (the readers' decoder): rows once, positions at the Begin, no violations."""
    from msgstream_spark.stream.decode import ChannelDecoder

    cfg = config_file(local_env, tmp_path)
    chans = [local_env.new_channel("dec") for _ in range(2)]
    (_, a), (_, b) = (_writer(cfg, chans, wireFormat="2.6", transactional="true", writerId=w) for w in "ab")
    a.ticks = b.ticks = False
    b.add(_batch(list(range(100, 150))))
    a.write_batches([_batch(list(range(50))), _batch([3, 4], ["delete"] * 2)])
    b.write_batches([])
    _, failed = _writer(cfg, chans, wireFormat="2.6", transactional="true", writerId="c")
    failed.add(_batch(list(range(200, 220))))
    failed.flush(wait=True)
    failed.close()  # never finished: rolled back
    _, driver = _writer(cfg, chans, wireFormat="2.6")
    driver.send_ticks(chans, after_ts=max(st.max_ts for w in (a, b, failed) for st in w.result.channels.values()))
    driver.close()
    pks, deleted = [], []
    with local_env.client() as c:
        for ch in chans:
            dec = ChannelDecoder(ch, "local", id_of=c.bytes_to_message_id)
            raw = raw_messages(c, ch)
            begins = {parse_envelope(m.properties).txn_id: m.id.serialize() for m in raw if m.properties["_t"] == "900"}
            for d in dec.feed_all(raw):
                if d.row_bearing:
                    assert d.position.msg_id == begins[d.txn_id] and d.position.timestamp == d.time_tick
                    if type(d.msg).__name__ == "InsertMsg":
                        pks.extend(next(f for f in d.msg.proto.fields_data if f.field_name == "pk")
                                   .scalars.long_data.data)
                    else:
                        deleted.extend(d.msg.primary_keys)
            assert dec.stats["tt_violations"] == 0 and not dec.has_open
            assert dec.txn.stats["committed"] == 2 and dec.txn.stats["rolled_back"] == 1
    assert sorted(pks) == [*range(50), *range(100, 150)] and sorted(deleted) == [3, 4]
