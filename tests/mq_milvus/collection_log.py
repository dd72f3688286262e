"""A collection written as Milvus writes it, with the model the suite's proxy answers queries from.

Messages: 2.6 WAL entries (properties and headers from the independent producer tests/wal26/producer.py,
bodies Milvus's generated ``msgpb`` classes) into the suite proxy's store, or 2.5 msgstream messages
(Milvus's ``msgpb`` protobufs; ``msg_type`` on what the proxy's ``Produce`` sends, no properties on
RootCoord's broadcasts: CreateCollection, TimeTick; shared/docs/milvus-wire-format.md §5) on any
backend. Each write allocates its time from the proxy's TSO and writes its messages and changes the
model while holding the proxy's lock, so a ``Query`` sees exactly the writes before it and no write
lands below a TimeTick the proxy persisted. Simplified: row i's shard is ``i % shards`` (Milvus hashes
the key), its partition ``_default`` or ``p1`` by ``i // 2 % 2``; one segment; an upsert is a
transaction (2.6) or an Insert and a Delete with one timestamp (2.5), per shard and partition.
"""

from __future__ import annotations

import itertools
import random
import threading
from collections import defaultdict

from msgstream_spark.mq.base import ProducerMessage
from msgstream_spark.msg.pb import common_pb2, msg_pb2, schema_pb2
from tests.milvus_proxy.query import CollectionModel, columns
from tests.milvus_proxy.wal import tso_now
from tests.wal26 import producer as P

NAME = "snap"
CID, SEGMENT = 7001, 7003
PARTITIONS = [("_default", 7002), ("p1", 7004)]
DIM = 4
FIELDS = ["pk", "s", "f", "j", "fv", "$meta"]
DT = schema_pb2.DataType


def collection_schema(string_key: bool = False) -> schema_pb2.CollectionSchema:
    """pk (Int64, or VarChar with ``string_key``), s, f, j, fv and the dynamic field."""
    s = schema_pb2.CollectionSchema(name=NAME, enable_dynamic_field=True)
    pk = s.fields.add(fieldID=100, name="pk", is_primary_key=True, data_type=DT.VarChar if string_key else DT.Int64)
    if string_key:
        pk.type_params.add(key="max_length", value="32")
    s.fields.add(fieldID=101, name="s", data_type=DT.VarChar).type_params.add(key="max_length", value="64")
    s.fields.add(fieldID=102, name="f", data_type=DT.Float)
    s.fields.add(fieldID=103, name="j", data_type=DT.JSON)
    s.fields.add(fieldID=104, name="fv", data_type=DT.FloatVector).type_params.add(key="dim", value=str(DIM))
    s.fields.add(fieldID=105, name="$meta", data_type=DT.JSON, is_dynamic=True)
    return s


def key(i: int, string_key: bool) -> int | str:
    """Row ``i``'s primary key (VarChar keys sort unlike their numbers: "k10" < "k9")."""
    return f"k{i}" if string_key else i


def index(pk: int | str) -> int:
    return int(pk[1:]) if isinstance(pk, str) else pk


def partition_of(i: int) -> int:
    """Row ``i``'s partition, an index into :data:`PARTITIONS`."""
    return i // 2 % len(PARTITIONS)


def row(pk: int | str, gen: int = 0) -> dict:
    """Deterministic values (``gen`` > 0: an upserted version); the dynamic key only on some rows."""
    k = index(pk) + 1000 * gen
    return {"pk": pk, "s": f"s{k}", "f": k / 4.0, "j": {"k": k, "tag": "ab"[k % 2]},
            "fv": [k / 7.0, -k / 3.0, 0.1 * k, 1.0], "$meta": {"dyn": k * 2} if k % 2 == 0 else {}}


def _base(msg_type: int, ts: int, msg_id: int = 0) -> common_pb2.MsgBase:
    return common_pb2.MsgBase(msg_type=msg_type, msgID=msg_id, timestamp=ts, sourceID=7)


class Channels:
    """The collection's pchannels and vchannels (``<pchannel>_<id>v<i>``)."""

    def __init__(self, pchannels: list[str], string_key: bool = False) -> None:
        self.pchannels = list(pchannels)
        self.string_key = string_key
        self.vchannels = [f"{p}_{CID}v{i}" for i, p in enumerate(pchannels)]
        self._ids = itertools.count(1)

    def next_id(self) -> int:
        return next(self._ids)

    def create_request(self, ts: int) -> msg_pb2.CreateCollectionRequest:
        return msg_pb2.CreateCollectionRequest(
            base=_base(100, ts), collectionName=NAME, collectionID=CID, db_name="default",
            schema=collection_schema(self.string_key).SerializeToString(), partitionIDs=[i for _, i in PARTITIONS],
            virtualChannelNames=self.vchannels, physicalChannelNames=self.pchannels)

    def insert_request(self, ts: int, shard: int, part: int, rows: list[dict]) -> msg_pb2.InsertRequest:
        n = len(rows)
        name, pid = PARTITIONS[part]
        req = msg_pb2.InsertRequest(
            base=_base(400, ts, self.next_id()), shardName=self.vchannels[shard], db_name="default",
            collection_name=NAME, partition_name=name, collectionID=CID, partitionID=pid,
            segmentID=SEGMENT, num_rows=n, fields_data=columns(collection_schema(self.string_key), rows),
            version=msg_pb2.InsertDataVersion.ColumnBased)
        req.timestamps.extend([ts] * n)
        req.rowIDs.extend(self.next_id() for _ in rows)
        return req

    def delete_request(self, ts: int, shard: int, pks: list) -> msg_pb2.DeleteRequest:
        req = msg_pb2.DeleteRequest(base=_base(401, ts, self.next_id()), shardName=self.vchannels[shard],
                                    db_name="default", collection_name=NAME, collectionID=CID, partitionID=-1,
                                    num_rows=len(pks))
        (req.primary_keys.str_id if self.string_key else req.primary_keys.int_id).data.extend(pks)
        req.timestamps.extend([ts] * len(pks))
        return req


class Wal26(Channels):
    """2.6 WAL entries on the pchannels of a backend client (the proxy's store)."""

    def __init__(self, client, pchannels: list[str], string_key: bool = False) -> None:
        super().__init__(pchannels, string_key)
        self.producers = [client.create_producer(p) for p in pchannels]
        self._txn = itertools.count(900)

    def _send(self, shard: int, built: P.Built) -> None:
        self.producers[shard].send_batch([ProducerMessage(built.payload, built.properties, built.tt)])

    def create(self, ts: int) -> None:
        body = self.create_request(ts - P.PAYLOAD_TS_SKEW).SerializeToString()
        header = P.vfield(1, CID) + P.packed(2, [i for _, i in PARTITIONS]) + P.vfield(3, 1)
        for i, vc in enumerate(self.vchannels):
            self._send(i, P.Built(body, P.props(P.T["CreateCollection"], ts, vc=vc, header=header), ts))

    def _insert(self, ts: int, shard: int, part: int, rows: list[dict]) -> P.Built:
        body = self.insert_request(ts - P.PAYLOAD_TS_SKEW, shard, part, rows).SerializeToString()
        header = P.insert_header(CID, [(PARTITIONS[part][1], len(rows), 64 * len(rows), SEGMENT)])
        return P.Built(body, P.props(P.T["Insert"], ts, vc=self.vchannels[shard], header=header), ts)

    def _delete(self, ts: int, shard: int, pks: list[int]) -> P.Built:
        body = self.delete_request(ts - P.PAYLOAD_TS_SKEW, shard, pks).SerializeToString()
        return P.Built(body, P.props(P.T["Delete"], ts, vc=self.vchannels[shard],
                                     header=P.delete_header(CID, len(pks))), ts)

    def insert(self, ts: int, shard: int, part: int, rows: list[dict]) -> None:
        self._send(shard, self._insert(ts, shard, part, rows))

    def delete(self, ts: int, shard: int, pks: list[int]) -> None:
        self._send(shard, self._delete(ts, shard, pks))

    def upsert(self, shard: int, part: int, rows: list[dict]) -> int:
        """BeginTxn, Delete, Insert, CommitTxn (each with its own TSO): the commit's time, when it applies."""
        txn, vc = next(self._txn), self.vchannels[shard]
        ts = [tso_now() for _ in range(4)]
        pks = [r["pk"] for r in rows]
        for built in (P.begin_txn(ts[0], txn, vc=vc), P.in_txn(self._delete(ts[1], shard, pks), txn),
                      P.in_txn(self._insert(ts[2], shard, part, rows), txn), P.commit_txn(ts[3], txn, vc=vc)):
            self._send(shard, built)
        return ts[3]

    def tick(self, ts: int) -> None:
        for i in range(len(self.pchannels)):
            self._send(i, P.timetick(ts))

    def close(self) -> None:
        for p in self.producers:
            p.close()


class Msgstream25(Channels):
    """2.5 msgstream messages on the topics of a backend client (Kafka, Pulsar, the embedded log)."""

    def __init__(self, client, pchannels: list[str], string_key: bool = False) -> None:
        super().__init__(pchannels, string_key)
        self.producers = [client.create_producer(p) for p in pchannels]

    def _send(self, shard: int, msg, props: dict, ts: int) -> None:
        self.producers[shard].send_batch([ProducerMessage(msg.SerializeToString(), props, ts)])

    def create(self, ts: int) -> None:
        for i in range(len(self.pchannels)):  # RootCoord's Broadcast: no msg_type property
            self._send(i, self.create_request(ts), {}, ts)

    def insert(self, ts: int, shard: int, part: int, rows: list[dict]) -> None:
        self._send(shard, self.insert_request(ts, shard, part, rows), {"msg_type": "Insert"}, ts)

    def delete(self, ts: int, shard: int, pks: list[int]) -> None:
        self._send(shard, self.delete_request(ts, shard, pks), {"msg_type": "Delete"}, ts)

    def upsert(self, shard: int, part: int, rows: list[dict]) -> int:
        """The proxy's one pack: the Insert, then the Delete of the same keys, with one timestamp."""
        ts = tso_now()
        self.insert(ts, shard, part, rows)
        self.delete(ts, shard, [r["pk"] for r in rows])
        return ts

    def tick(self, ts: int) -> None:
        for i in range(len(self.pchannels)):
            self._send(i, msg_pb2.TimeTickMsg(base=_base(1200, ts)), {}, ts)

    def close(self) -> None:
        for p in self.producers:
            p.close()


class Writer:
    """Inserts, deletes and upserts through ``log`` and ``model`` together, under the model's lock; as a
    thread (``start``), a round every ``pace`` seconds until ``stop``."""

    def __init__(self, log: Wal26 | Msgstream25, model: CollectionModel, seed: int = 7) -> None:
        self.log, self.model, self.lock = log, model, model.lock
        self.rand = random.Random(seed)
        self.next_index = 0
        self.acked: list[tuple[str, int, int]] = []  # (kind, ts, model version after it)
        self.events: list[tuple[str, int | str]] = []  # (op, pk) of every row change written
        self.rounds = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.error: BaseException | None = None

    def _by_shard(self, indices) -> dict[tuple[int, int], list]:
        """Row indices -> their primary keys per (shard, partition)."""
        out: dict[tuple[int, int], list] = defaultdict(list)
        for i in indices:
            out[(i % len(self.log.pchannels), partition_of(i))].append(key(i, self.log.string_key))
        return out

    def create(self) -> None:
        with self.lock:
            self.log.create(tso_now())

    def insert(self, indices, gen: int = 0) -> None:
        """Rows ``indices`` (keys from :func:`key`) inserted with one timestamp."""
        with self.lock:
            ts = tso_now()
            for (shard, part), keys in self._by_shard(indices).items():
                self.log.insert(ts, shard, part, [row(pk, gen) for pk in keys])
                self.model.put((row(pk, gen) for pk in keys), PARTITIONS[part][0], ts)
                self.events += [("insert", pk) for pk in keys]
            self.acked.append(("insert", ts, self.model.version))
            self.next_index = max(self.next_index, max(indices, default=-1) + 1)

    def delete(self, indices) -> None:
        with self.lock:
            ts = tso_now()
            shards: dict[int, list] = defaultdict(list)  # Milvus's delete: one message a shard, every partition
            for (shard, _), keys in self._by_shard(indices).items():
                shards[shard] += keys
            for shard, keys in shards.items():
                self.log.delete(ts, shard, keys)
                self.model.remove(keys, ts)
                self.events += [("delete", pk) for pk in keys]
            self.acked.append(("delete", ts, self.model.version))

    def upsert(self, indices, gen: int) -> None:
        with self.lock:
            for (shard, part), keys in self._by_shard(indices).items():
                ts = self.log.upsert(shard, part, [row(pk, gen) for pk in keys])
                self.model.put((row(pk, gen) for pk in keys), PARTITIONS[part][0], ts)
                self.events += [(op, pk) for pk in keys for op in ("delete", "insert")]
                self.acked.append(("upsert", ts, self.model.version))

    def tick(self) -> None:
        with self.lock:
            self.log.tick(tso_now())

    def round(self) -> None:
        """New keys, deletes and upserts of existing ones, then a TimeTick on every channel."""
        with self.lock:
            existing = sorted(index(pk) for pk in self.model.rows)
            self.insert(range(self.next_index, self.next_index + 5))
            self.delete(self.rand.sample(existing, 2))
            self.upsert(self.rand.sample(existing, 3), gen=1 + self.rounds % 3)
            self.tick()
            self.rounds += 1

    def _loop(self, after: threading.Event, pace: float, max_rounds: int) -> None:
        try:
            waited = 0.0
            while not after.wait(0.1):
                waited += 0.1
                if self._stop.is_set():
                    return
                if waited > 120:
                    raise TimeoutError("the writer's start event was not set within 120 s")
            while self.rounds < max_rounds and not self._stop.wait(pace):
                self.round()
        except BaseException as exc:  # noqa: BLE001 - reported by stop()
            self.error = exc

    def start(self, after: threading.Event, pace: float = 0.05, max_rounds: int = 200) -> Writer:
        self._thread = threading.Thread(target=self._loop, args=(after, pace, max_rounds), daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(60)
            assert not self._thread.is_alive(), "the writer did not stop"
        if self.error is not None:
            raise self.error
