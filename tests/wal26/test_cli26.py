"""``msgstream tail`` and ``inspect`` on Milvus 2.6 WAL messages (embedded log): the upgrade boundary,
transactions as Milvus applies them, the envelope, properties on the command line, one-line errors."""

from __future__ import annotations

import base64
import json

from msgstream_spark.cli.main import main
from tests.sink.helpers import config_file
from tests.wal26 import producer as P
from tests.wal26.test_stream26 import COLL, TT, scenario, write_wal


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, [json.loads(line) for line in out.splitlines() if line.strip()], err


def _channel(local_env, items=None):
    ch = local_env.new_channel(P.PCHANNEL)
    with local_env.client() as client:
        write_wal(client, ch, items if items is not None else scenario(f"{ch}_{COLL}v0"))
    return ch


def test_tail_reads_the_boundary_and_shows_transactions_as_applied(local_env, tmp_path, capsys):
    cfg = config_file(local_env, tmp_path)
    ch = _channel(local_env)
    code, out, err = run_cli(capsys, "tail", "--config", cfg, "-c", ch, "--timeout", "0.5", "--rows")
    assert code == 0, err
    shown = [(m["msg_type"], m.get("wal", {}).get("time_tick")) for m in out]
    assert shown == [
        ("Insert", None), ("TimeTick", None), ("TimeTick", TT), ("Insert", TT + 1),
        ("BeginTxn", TT + 2), ("Delete", TT + 5), ("Insert", TT + 5), ("CommitTxn", TT + 5),  # bodies at the commit
        ("BeginTxn", TT + 10), ("RollbackTxn", TT + 13),  # rolled back: no bodies
        ("TimeTick", TT + 15), ("TimeTick", TT + 22), ("Insert", TT + 24),
        ("BeginTxn", TT + 20), ("Delete", TT + 23), ("Insert", TT + 23), ("CommitTxn", TT + 23), ("TimeTick", TT + 30)]
    ins = out[3]
    assert ins["wal"]["vchannel"] == f"{ch}_{COLL}v0" and ins["wal"]["version"] == 1
    assert ins["timestamp"] == TT + 1 and ins["rows"][0]["pk"] == 2 and ins["wal"]["header"]["collection_id"] == COLL
    assert out[5]["wal"]["txn"]["txn_id"] == 31 and out[0].get("wal") is None  # 2.5: no envelope
    # --from a 2.6 position (base64 MsgPosition, as `position` prints and Milvus keeps): skip _tt <= its ts
    code, pos, _ = run_cli(capsys, "position", "--config", cfg, "-c", ch, "--at", str(TT + 15))
    code, after, err = run_cli(capsys, "tail", "--config", cfg, "-c", ch, "--timeout", "0.5", "--from",
                               pos[0]["base64"], "--no-ticks")
    assert code == 0, err
    assert [(m["msg_type"], m["wal"]["time_tick"]) for m in after] == [
        ("Insert", TT + 24), ("BeginTxn", TT + 20), ("Delete", TT + 23), ("Insert", TT + 23), ("CommitTxn", TT + 23)]


def test_tail_fails_on_an_encrypted_message_with_one_line(local_env, tmp_path, capsys):
    cfg = config_file(local_env, tmp_path)
    ch = _channel(local_env, [P.timetick(TT, lcs=True), P.insert(TT + 1, [1]), P.encrypted_insert(TT + 2, [2])])
    code, out, err = run_cli(capsys, "tail", "--config", cfg, "-c", ch, "--timeout", "0.5")
    assert code == 1 and err.count("\n") == 1
    assert "encrypted Insert" in err and f"channel={ch}" in err and "msgID(base64)=" in err
    assert [m["msg_type"] for m in out] == ["TimeTick", "Insert"]


def test_inspect_takes_properties_and_shows_the_envelope(tmp_path, capsys):
    ins = P.insert(TT + 7, [4, 5], lc="rs")
    args = ["inspect", "--base64", base64.b64encode(ins.payload).decode(), "--rows"]
    props = [a for k, v in ins.properties.items() for a in ("--property", f"{k}={v}")]
    code, out, err = run_cli(capsys, *args, *props)
    assert code == 0, err
    m = out[0]
    assert m["msg_type"] == "Insert" and m["timestamp"] == TT + 7 and [r["pk"] for r in m["rows"]] == [4, 5]
    assert m["wal"]["time_tick"] == TT + 7 and m["wal"]["vchannel"] == P.VCHANNEL and m["wal"]["last_confirmed"] == "rs"
    assert m["shardName"] == P.VCHANNEL and m["properties"]["_tt"] == P.b36(TT + 7)

    begin = P.begin_txn(TT, 9, keepalive_ms=500)
    code, out, err = run_cli(capsys, "inspect", "--base64", base64.b64encode(begin.payload).decode(),
                             "--properties", json.dumps(begin.properties))
    assert code == 0, err
    assert out[0]["msg_type"] == "BeginTxn" and out[0]["wal"]["txn"] == {"txn_id": 9, "keepalive_ms": 500}
    assert out[0]["wal"]["version"] == 2 and out[0]["body_bytes"] == 0

    bcast = P.broadcast(P.create_collection, TT, 77, [P.CONTROL_VCHANNEL, P.VCHANNEL])[0]
    f = tmp_path / "cc.bin"
    f.write_bytes(bcast.payload)
    code, out, err = run_cli(capsys, "inspect", "--file", str(f), "--properties", json.dumps(bcast.properties))
    assert code == 0, err
    assert out[0]["wal"]["broadcast"]["broadcast_id"] == 77 and out[0]["wal"]["control_vchannel"] is True

    alter = P.alter_collection(TT + 3)
    code, out, err = run_cli(capsys, "inspect", "--base64", base64.b64encode(alter.payload).decode(),
                             "--properties", json.dumps(alter.properties))
    assert code == 0 and out[0]["schema_fields"][-1] == "note"


def test_inspect_errors_are_one_line(capsys):
    enc = P.encrypted_insert(TT, [1])
    code, _, err = run_cli(capsys, "inspect", "--base64", base64.b64encode(enc.payload).decode(),
                           "--properties", json.dumps(enc.properties))
    assert code == 1 and err.count("\n") == 1 and "encrypted Insert" in err and "wrapped-key" not in err
    for bad in (["--property", "novalue"], ["--properties", "[1]"], ["--properties", '{"_v": 1}'],
                ["--property", "_v=1", "--property", "_t=2", "--property", "_tt=zz!"]):
        code, _, err = run_cli(capsys, "inspect", "--base64", "AA==", *bad)
        assert code == 1 and err.count("\n") == 1 and err.startswith("msgstream inspect: error:"), (bad, err)


def test_tail_from_a_wal_checkpoint_or_message_id(local_env, tmp_path, capsys):
    """Milvus 2.6 resume points: AT the id, skipping _tt <= the checkpoint's time tick."""
    cfg = config_file(local_env, tmp_path)
    ch = _channel(local_env)
    with local_env.client() as c:
        r = c.reader(ch)
        r.seek(c.earliest_message_id(), inclusive=True)
        ids = [m.id for m in r.receive_batch(100, 2.0)]
        r.unsubscribe()
    begin_id = P.b36(ids[13].value)  # the open transaction's Begin (txn 33)
    cp = base64.b64encode(P.wal_checkpoint(begin_id, 1, TT + 22)).decode()  # RocksMQ form: the embedded log
    code, out, err = run_cli(capsys, "tail", "--config", cfg, "-c", ch, "--timeout", "0.5", "--no-ticks",
                             "--from", f"checkpoint:{cp}")
    assert code == 0, err
    assert [(m["msg_type"], m["wal"]["time_tick"]) for m in out] == [
        ("Insert", TT + 24), ("BeginTxn", TT + 20), ("Delete", TT + 23), ("Insert", TT + 23), ("CommitTxn", TT + 23)]
    mid = json.dumps({"id": P.b36(ids[17].value), "wal_name": "RocksMQ"})
    code, out, err = run_cli(capsys, "tail", "--config", cfg, "-c", ch, "--timeout", "0.5", "--no-ticks",
                             "--from", f"message-id:{mid}")
    assert code == 0, err  # starting at the insert after the body: the open transaction is rebuilt from _lc
    assert [m["msg_type"] for m in out] == ["Insert", "BeginTxn", "Delete", "Insert", "CommitTxn"]
    code, _, err = run_cli(capsys, "tail", "--config", cfg, "-c", f"{ch},{ch}x", "--from", f"checkpoint:{cp}")
    assert code == 2 and "one channel" in err
    code, _, err = run_cli(capsys, "tail", "--config", cfg, "-c", ch, "--from", "checkpoint:!!")
    assert code == 1 and err.count("\n") == 1 and "not a checkpoint" in err
