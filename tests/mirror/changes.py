"""Test changes as Milvus writes them (messages of rows on channels) and an independent model of what
Milvus's ``query`` returns after them: a row inserted at ts t is hidden by a delete of its pk at a later
ts (a delete at t does not hide an insert at t: an upsert), and of the rows left the one with the latest
ts wins, then the first one in its message (what the real Milvus 2.3.5 returns:
tests/milvus_real/test_repeated_pk.py)."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from msgstream_spark.mirror import apply_batch
from msgstream_spark.mirror.order import seq_array, snapshot_seq_array

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


def mixed_batches(k: int, first: int = 0) -> list[list]:
    """Batches ``first .. first + k - 1`` of one workload: batch 0 inserts keys 0..39, batch i upserts every 4th
    key from ``i % 4`` and deletes keys ``i`` and ``i + 20``."""
    out = [[insert(10, *[(p, f"a{p}") for p in range(40)])]] if first == 0 else []
    for i in range(max(first, 1), first + k):
        ts = 10 + 10 * i
        out.append([*upsert(ts, *[(p, f"u{i}.{p}") for p in range(i % 4, 40, 4)]), delete(ts + 1, i, i + 20)])
    return out


def fill(t, batches: list[list], first: int = 0) -> list[Msg]:
    """Each batch applied to the table ``t`` as batch ``first + i`` of query ``q``; the messages applied."""
    seen: list[Msg] = []
    for i, b in enumerate(batches):
        assert apply_batch(t, to_arrow(b), "pk", "q", first + i)
        seen += b
    return seen


class HeldMilvus:
    """A ``MilvusSide`` over rows held here (pk -> v): what a verify or a repair reads of Milvus."""

    pk, by_partition, json_columns = "pk", False, ()

    def __init__(self, rows: dict[int, str]) -> None:
        self.rows = rows

    def rows_of(self, keys: list, schema: pa.Schema, s: int) -> pa.Table:
        have = [k for k in keys if k in self.rows]
        n = len(have)
        return pa.table({"pk": pa.array(have, pa.int64()), "v": [self.rows[k] for k in have],
                         "fv": pa.array([vector(self.rows[k]) for k in have], pa.list_(pa.float32())),
                         "_ts": pa.array([s] * n, pa.int64()), "_seq": snapshot_seq_array(s, n),
                         "_partition": pa.array([7] * n, pa.int64())}).select(schema.names).cast(schema)

    def scan(self, schema: pa.Schema, s: int):
        yield from self.rows_of(sorted(self.rows), schema, s).to_batches()
