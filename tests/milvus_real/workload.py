"""What the tests ask the real Milvus to do, and what Milvus acknowledged (MutationResult timestamps)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import numpy as np

DIM = 4
BDIM = 16
SHARDS = 2


def row(i: int, gen: int = 0) -> dict:
    """Deterministic values of every type Milvus 2.3.5 has (``gen`` > 0: an upserted version)."""
    k = i + 1000 * gen
    r = {
        "pk": i, "b": k % 2 == 0, "i8": (k % 200) - 100, "i16": k * 3 - 500, "i32": k * 1000,
        "f": k / 4.0, "d": k / 3.0, "s": f"s{k}", "j": {"k": k, "tag": ["a", "b"][k % 2]},
        "arr_i": [k, k + 1, k + 2][: k % 4], "arr_s": [f"x{k}"] * (k % 3), "cat": k % 5,
        "fv": [float(np.float32(k)), k + 0.5, -float(k), 1.0],
    }
    if k % 2 == 0:
        r["dyn"] = k * 2  # dynamic field: only on some rows
    return r


def all_types_schema():
    from pymilvus import CollectionSchema, DataType, FieldSchema

    return CollectionSchema([
        FieldSchema("pk", DataType.INT64, is_primary=True),
        FieldSchema("b", DataType.BOOL), FieldSchema("i8", DataType.INT8), FieldSchema("i16", DataType.INT16),
        FieldSchema("i32", DataType.INT32), FieldSchema("f", DataType.FLOAT), FieldSchema("d", DataType.DOUBLE),
        FieldSchema("s", DataType.VARCHAR, max_length=64), FieldSchema("j", DataType.JSON),
        FieldSchema("arr_i", DataType.ARRAY, element_type=DataType.INT64, max_capacity=4),
        FieldSchema("arr_s", DataType.ARRAY, element_type=DataType.VARCHAR, max_capacity=4, max_length=16),
        FieldSchema("cat", DataType.INT64, is_partition_key=True),
        FieldSchema("fv", DataType.FLOAT_VECTOR, dim=DIM),  # 2.3.5: one vector field per collection
    ], enable_dynamic_field=True)


def bin_schema():
    """The other vector type (2.3.5 allows one vector field per collection), a VarChar key."""
    from pymilvus import CollectionSchema, DataType, FieldSchema

    return CollectionSchema([FieldSchema("key", DataType.VARCHAR, is_primary=True, max_length=32),
                             FieldSchema("bv", DataType.BINARY_VECTOR, dim=BDIM)])


def bin_row(i: int) -> dict:
    return {"key": f"k{i}", "bv": bytes([i % 256, (i * 7) % 256])}


@dataclass
class Acked:
    """One acknowledged mutation: kind (insert/delete/upsert), primary keys, MutationResult timestamp."""

    kind: str
    pks: list[int]
    ts: int
    gen: int = 0


@dataclass
class Workload:
    name: str
    collection: object
    acked: list[Acked] = field(default_factory=list)

    def insert(self, pks, gen: int = 0) -> Acked:
        r = self.collection.insert([row(i, gen) for i in pks])
        a = Acked("insert", list(pks), int(r.timestamp), gen)
        self.acked.append(a)
        return a

    def delete(self, pks) -> Acked:
        r = self.collection.delete(f"pk in {list(pks)}")
        a = Acked("delete", list(pks), int(r.timestamp))  # Milvus 2.3.5 answers timestamp 0 here
        self.acked.append(a)
        return a

    def upsert(self, pks, gen: int) -> Acked:
        r = self.collection.upsert([row(i, gen) for i in pks])
        a = Acked("upsert", list(pks), int(r.timestamp), gen)
        self.acked.append(a)
        return a

    def final_rows(self) -> dict[int, dict]:
        """pk -> row after every acknowledged mutation, in order."""
        state: dict[int, dict] = {}
        for a in self.acked:
            for pk in a.pks:
                if a.kind == "delete":
                    state.pop(pk, None)
                else:
                    state[pk] = row(pk, a.gen)
        return state


def create_all_types(alias: str, name: str, partitions: int = 3):
    from pymilvus import Collection

    return Collection(name, all_types_schema(), using=alias, shards_num=SHARDS, num_partitions=partitions)


POLL = 0.05  # s between the asks of a wait below: Milvus answers each in a few ms


def _until(done, what: str, timeout: float) -> None:
    """Ask ``done()`` every POLL s until it is true; fail naming ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    while not done():
        assert time.monotonic() < deadline, f"{what}: not done within {timeout:.0f} s"
        time.sleep(POLL)  # polling Milvus's own progress answer, bounded by the deadline


def flush(col, timeout: float = 120.0) -> None:
    """``col.flush()``: Flush, then GetFlushState until Milvus says the segments it sealed are flushed and each
    channel's checkpoint passed the flush, asked every POLL s (pymilvus's own wait asks every 0.5 s)."""
    from pymilvus import connections
    from pymilvus.client.utils import check_status
    from pymilvus.grpc_gen import milvus_pb2

    h = connections._fetch_handler(col._using)
    resp = h._stub.Flush(milvus_pb2.FlushRequest(collection_names=[col.name]), timeout=30)
    check_status(resp.status)
    segments, flush_ts = list(resp.coll_segIDs[col.name].data), resp.coll_flush_ts[col.name]
    _until(lambda: h.get_flush_state(segments, col.name, flush_ts, timeout=30), f"flush of {col.name}", timeout)


def load(col, timeout: float = 120.0) -> None:
    """``col.load()``, its progress asked every POLL s (pymilvus's own wait asks every 0.2 s)."""
    from pymilvus import connections

    col.load(_async=True)
    h = connections._fetch_handler(col._using)
    _until(lambda: h.get_loading_progress(col.name, timeout=30) >= 100, f"load of {col.name}", timeout)


def load_for_query(col, vector: str = "fv", flushed: bool = True) -> None:
    """An index on the vector field (2.3.5 loads no collection without one) and the collection loaded, for
    ``query``; ``flushed``: flushed first (sealed segments, binlogs and the channels' checkpoints in etcd). A query
    reads growing segments as well, but 2.3.5 answered wrongly over them where a key sits in two segments (a key in
    two partitions after an upsert; a re-inserted key with array fields): those tests flush. The index is declared
    without waiting for its build (pymilvus's wait sleeps 0.5 s before its first ask): a query does not use it."""
    if flushed:
        flush(col)
    if vector == "bv":
        col.create_index("bv", {"index_type": "BIN_FLAT", "metric_type": "HAMMING", "params": {}}, sync=False)
    else:
        col.create_index("fv", {"index_type": "FLAT", "metric_type": "L2", "params": {}}, sync=False)
    load(col)


def normalize(r: dict) -> dict:
    """A row as comparable plain values (JSON as objects, floats as float32 where Milvus keeps float32)."""
    out = dict(r)
    for key in ("j", "$meta"):
        if isinstance(out.get(key), (str, bytes)):
            out[key] = json.loads(out[key]) if out[key] else {}
    if "f" in out and out["f"] is not None:
        out["f"] = float(np.float32(out["f"]))
    if out.get("fv") is not None:
        out["fv"] = [float(np.float32(x)) for x in out["fv"]]
    if isinstance(out.get("bv"), (bytearray, memoryview)):
        out["bv"] = bytes(out["bv"])
    if isinstance(out.get("bv"), list):  # pymilvus query returns a binary vector as [bytes]
        out["bv"] = bytes(out["bv"][0])
    for key in ("arr_i", "arr_s"):
        if out.get(key) is not None:
            out[key] = list(out[key])
    return out


def expected_row(pk: int, gen: int) -> dict:
    r = row(pk, gen)
    dyn = {"dyn": r.pop("dyn")} if "dyn" in r else {}
    r["$meta"] = dyn
    return normalize(r)
