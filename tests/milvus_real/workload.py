"""What the tests ask the real Milvus to do, and what Milvus acknowledged (MutationResult timestamps)."""

from __future__ import annotations

import json
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


def load_for_query(col, vector: str = "fv") -> None:
    col.flush()
    if vector == "bv":
        col.create_index("bv", {"index_type": "BIN_FLAT", "metric_type": "HAMMING", "params": {}})
    else:
        col.create_index("fv", {"index_type": "FLAT", "metric_type": "L2", "params": {}})
    col.load(timeout=120)


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
