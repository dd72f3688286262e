"""Test changes as Milvus writes them (messages of rows on channels) and an independent model of what
Milvus's ``query`` returns after them: a row inserted at ts t is hidden by a delete of its pk at a later
ts (a delete at t does not hide an insert at t: an upsert), and of the rows left the one with the latest
ts wins, then the first one in its message (what the real Milvus 2.3.5 returns:
tests/milvus_real/test_repeated_pk.py)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from msgstream_spark.mirror.order import seq_array

FIELDS = pa.schema([pa.field("pk", pa.int64()), pa.field("v", pa.string()), pa.field("fv", pa.list_(pa.float32(), 2))])


@dataclass
class Msg:
    op: str  # insert / delete
    ts: int
    rows: list  # insert: [(pk, v)], delete: [pk]
    channel: str = "ch0"


def insert(ts, *rows, channel="ch0") -> Msg:
    return Msg("insert", ts, list(rows), channel)


def delete(ts, *pks, channel="ch0") -> Msg:
    return Msg("delete", ts, list(pks), channel)


def upsert(ts, *rows, channel="ch0") -> list[Msg]:
    """Milvus 2.3.5 writes an upsert as a Delete then an Insert with one timestamp."""
    return [delete(ts, *[pk for pk, _ in rows], channel=channel), insert(ts, *rows, channel=channel)]


def vector(v: str) -> list[float]:
    return [float(len(v)), float(sum(map(ord, v)) % 97)]


def to_arrow(msgs: list[Msg], partition: int = 7) -> pa.Table:
    """The rows output of these messages (in this arrival order): op, fields, _ts, _seq, _partition."""
    pieces = []
    for m in msgs:
        n = len(m.rows)
        ts = np.full(n, m.ts, dtype=np.uint64)
        if m.op == "insert":
            pks = [pk for pk, _ in m.rows]
            vs = [v for _, v in m.rows]
            fv = [vector(v) for v in vs]
        else:
            pks, vs, fv = list(m.rows), [None] * n, [None] * n
        pieces.append(pa.table({
            "op": [m.op] * n, "pk": pa.array(pks, pa.int64()), "v": pa.array(vs, pa.string()),
            "fv": pa.array(fv, pa.list_(pa.float32())), "_channel": [m.channel] * n,
            "_ts": pa.array(ts.astype(np.int64)), "_seq": seq_array(ts, m.op),
            "_partition": pa.array([partition] * n, pa.int64())}))
    return pa.concat_tables(pieces) if pieces else to_arrow([insert(1, (0, "x"))]).slice(0, 0)


def model(msgs: list[Msg]) -> dict[int, tuple]:
    """pk -> (v, ts) that Milvus's query returns after all ``msgs`` (arrival order does not matter)."""
    inserts: dict[int, list] = {}
    deletes: dict[int, list] = {}
    for m in msgs:
        for i, r in enumerate(m.rows):
            if m.op == "insert":
                inserts.setdefault(r[0], []).append((m.ts, -i, r[1]))
            else:
                deletes.setdefault(r, []).append(m.ts)
    out = {}
    for pk, rows in inserts.items():
        live = [r for r in rows if not any(d > r[0] for d in deletes.get(pk, []))]
        if live:
            ts, _, v = max(live)
            out[pk] = (v, ts)
    return out


def table_state(t: pa.Table) -> dict[int, tuple]:
    rows = t.select(["pk", "v", "_ts", "fv"]).to_pylist()
    pks = [r["pk"] for r in rows]
    assert len(pks) == len(set(pks)), f"a pk appears twice in the table: {sorted(pks)}"
    for r in rows:
        assert list(r["fv"]) == vector(r["v"]), r
    return {r["pk"]: (r["v"], r["_ts"]) for r in rows}
