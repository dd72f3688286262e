"""The source's ``rows`` carry ``_seq`` (2.5 and 2.6 messages, from the independent test producer through
the embedded log): its parts are the row's timestamp, op and index in its message, and collapsing a read
by it gives the state a Milvus consumer applies."""

from __future__ import annotations

import pyarrow as pa

from msgstream_spark.mirror import collapse
from msgstream_spark.mirror.order import SEQ_TYPE, seq_parts, seq_value
from tests.spark import wal26_data as D


def _table(rows: list[dict]) -> pa.Table:
    return pa.table({"op": [r["op"] for r in rows], "pk": [r["pk"] for r in rows], "_ts": [r["_ts"] for r in rows],
                     "_seq": pa.array([r["_seq"] for r in rows], SEQ_TYPE)})


def test_rows_seq_on_25_and_26_messages(local_env):
    mixed, old = local_env.new_channel("mixed"), local_env.new_channel("old")
    D.write_mixed(local_env, mixed)
    D.write_as_25(local_env, old)
    got, as25 = D.read_direct(local_env, mixed), D.read_direct(local_env, old)
    assert [r["_seq"] for r in got] == [r["_seq"] for r in as25]  # 2.6 rows order like the same 2.5 rows
    for r in got:
        ts, op, _, _ = seq_parts(r["_seq"])
        assert (ts, op) == (r["_ts"], r["op"])
    ins = [r for r in got if r["_ts"] == D.TT + 4]
    assert [(r["pk"], r["_seq"]) for r in ins] == [(3, seq_value(D.TT + 4, "insert", 0)),
                                                   (4, seq_value(D.TT + 4, "insert", 1))]
    # the committed upsert (a delete and an insert of pk 2 at one timestamp): the insert wins
    state = collapse(_table(got), "pk").to_pylist()
    assert sorted((r["pk"], r["op"], r["_ts"]) for r in state) == [
        (1, "delete", D.TT + 5), (2, "insert", D.TT + 9), (3, "insert", D.TT + 4), (4, "insert", D.TT + 4),
        (6, "insert", D.TT + (7 << 18))]


def test_a_pk_repeated_in_one_message_keeps_its_first_row(local_env):
    ch = local_env.new_channel("dup")
    with local_env.client() as c, c.create_producer(ch) as prod:
        D.send(prod, [D.old_insert([7, 8, 7, 7], D.TT), D.old_delete([8], D.TT + 1), D.old_insert([8], D.TT + 1),
                      D.old_insert([9], D.TT + 2), D.old_insert([9], D.TT + 2)])  # one request split in two
    got = D.read_direct(local_env, ch)
    assert [seq_parts(r["_seq"])[2:] for r in got] == [(0, 0), (0, 1), (0, 2), (0, 3), (0, 0), (0, 0), (0, 0), (1, 0)]
    state = {r["pk"]: seq_parts(r["_seq"]) for r in collapse(_table(got), "pk").to_pylist()}
    assert state == {7: (D.TT, "insert", 0, 0), 8: (D.TT + 1, "insert", 0, 0), 9: (D.TT + 2, "insert", 0, 0)}
