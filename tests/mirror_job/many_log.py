"""Several collections in several databases on shared pchannels, written as Milvus 2.3-2.5 writes them, and the
rows each collection must hold.

Written from shared/docs (service-notes.md §1.2-1.4, milvus-wire-format.md §5), with Milvus's generated ``msgpb``
protobufs, not the project's own writer: RootCoord's CreateCollection goes to each of the collection's pchannels
with no ``msg_type`` property, no database and no collection name (the name is the schema's); its DropCollection
names the collection and its id; the proxy's Insert / Delete carry ``db_name``, ``collection_name``,
``shardName`` (``<pchannel>_<id>v<i>``) and ``msg_type``; an upsert is an Insert and a Delete of the same keys
with one timestamp; a TimeTick closes each step on every pchannel.
"""

from __future__ import annotations

import itertools
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import deltalake
import pyarrow as pa
import yaml

from msgstream_spark.mq.base import ProducerMessage
from msgstream_spark.msg.pb import common_pb2, msg_pb2, schema_pb2
from tests.milvus_proxy.query import columns
from tests.sink.helpers import config_file

DT = schema_pb2.DataType
DIM = 4


def schema(name: str) -> schema_pb2.CollectionSchema:
    s = schema_pb2.CollectionSchema(name=name)
    s.fields.add(fieldID=100, name="pk", is_primary_key=True, data_type=DT.Int64)
    s.fields.add(fieldID=101, name="s", data_type=DT.VarChar).type_params.add(key="max_length", value="64")
    s.fields.add(fieldID=102, name="fv", data_type=DT.FloatVector).type_params.add(key="dim", value=str(DIM))
    return s


def row(name: str, pk: int, gen: int = 0) -> dict:
    k = pk + 1000 * gen
    return {"pk": pk, "s": f"{name}-{k}", "fv": [k / 2.0, -k / 4.0, 1.0, float(gen)]}


def _base(t: int, ts: int, mid: int = 0) -> common_pb2.MsgBase:
    return common_pb2.MsgBase(msg_type=t, msgID=mid, timestamp=ts, sourceID=3)


class ManyLog:
    """The pchannels' producers; ``expected[(db, name, id)]``: {pk: row} each collection holds now; ``models``: the
    suite proxy's models (tests/milvus_proxy) the same writes go to, at the same Milvus times."""

    def __init__(self, client, pchannels: list[str]) -> None:
        self.pchannels = list(pchannels)
        self.producers = [client.create_producer(p) for p in pchannels]
        self.colls: dict[int, tuple[str, str]] = {}  # id -> (db, name)
        self.expected: dict[tuple[str, str, int], dict[int, dict]] = {}
        self._ts = itertools.count((int(time.time() * 1000) << 18), 1 << 18)
        self._ids = itertools.count(1)
        self.models: dict[int, object] = {}  # id -> the suite proxy's CollectionModel a snapshot queries, if any
        self.partition_of: dict[tuple[int, int], int] = {}  # (collection id, pk) -> the partition id of its row

    def listed(self, state, db: str, name: str, cid: int) -> None:
        """The collection in the suite proxy's ``state`` (tests/milvus_proxy): described, listed with its
        ``_default`` partition, queried from a model the log's later writes go to."""
        self.models[cid] = state.add_model(db, name, cid, self.pchannels,
                                           [self._vch(cid, i) for i in range(len(self.pchannels))], schema(name),
                                           [("_default", cid * 10)])

    def _send(self, i: int, msg, props: dict, ts: int) -> None:
        self.producers[i].send_batch([ProducerMessage(msg.SerializeToString(), props, ts)])

    def _vch(self, cid: int, i: int) -> str:
        return f"{self.pchannels[i]}_{cid}v{i}"

    def create(self, db: str, name: str, cid: int) -> None:
        ts = next(self._ts)
        req = msg_pb2.CreateCollectionRequest(  # 2.3-2.5: no db_name, dbID or collectionName
            base=_base(100, ts), collectionID=cid, partitionIDs=[cid * 10],
            schema=schema(name).SerializeToString(), physicalChannelNames=self.pchannels,
            virtualChannelNames=[self._vch(cid, i) for i in range(len(self.pchannels))])
        for i in range(len(self.pchannels)):
            self._send(i, req, {}, ts)
        self.colls[cid] = (db, name)
        self.expected[(db, name, cid)] = {}

    def drop(self, cid: int) -> int:
        ts = next(self._ts)
        db, name = self.colls[cid]
        req = msg_pb2.DropCollectionRequest(base=_base(101, ts), collectionName=name, collectionID=cid)
        for i in range(len(self.pchannels)):
            self._send(i, req, {}, ts)
        return ts

    def drop_partition(self, cid: int, pid: int) -> int:
        """RootCoord's DropPartition (its GC step, 2.3-2.5): to each of the collection's pchannels, no ``msg_type``
        property; every row of the partition is gone."""
        ts = next(self._ts)
        db, name = self.colls[cid]
        req = msg_pb2.DropPartitionRequest(base=_base(201, ts), collection_name=name, partition_name=f"p{pid}",
                                           collectionID=cid, partitionID=pid)
        for i in range(len(self.pchannels)):
            self._send(i, req, {}, ts)
        rows = self.expected[(db, name, cid)]
        for pk in [k for k in rows if self.partition_of.get((cid, k)) == pid]:
            del rows[pk]
        return ts

    def _shards(self, pks) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for pk in pks:
            out.setdefault(pk % len(self.pchannels), []).append(pk)
        return out

    def insert(self, cid: int, pks, gen: int = 0, ts: int | None = None, partition: int | None = None) -> None:
        """Rows into the collection's ``_default`` partition (id ``cid * 10``) or into partition id ``partition``."""
        ts = ts or next(self._ts)
        db, name = self.colls[cid]
        pid = partition or cid * 10
        for i, keys in self._shards(pks).items():
            rows = [row(name, pk, gen) for pk in keys]
            req = msg_pb2.InsertRequest(
                base=_base(400, ts, next(self._ids)), shardName=self._vch(cid, i), db_name=db, collection_name=name,
                partition_name="_default" if pid == cid * 10 else f"p{pid}", collectionID=cid, partitionID=pid,
                segmentID=pid * 100 + 1,
                num_rows=len(rows), fields_data=columns(schema(name), rows),
                version=msg_pb2.InsertDataVersion.ColumnBased)
            req.timestamps.extend([ts] * len(rows))
            req.rowIDs.extend(next(self._ids) for _ in rows)
            self._send(i, req, {"msg_type": "Insert"}, ts)
            self.expected[(db, name, cid)].update({r["pk"]: r for r in rows})
            self.partition_of.update({(cid, r["pk"]): pid for r in rows})
            if cid in self.models:
                self.models[cid].put(rows, "_default", ts)

    def delete(self, cid: int, pks, ts: int | None = None) -> None:
        ts = ts or next(self._ts)
        db, name = self.colls[cid]
        for i, keys in self._shards(pks).items():
            req = msg_pb2.DeleteRequest(base=_base(401, ts, next(self._ids)), shardName=self._vch(cid, i), db_name=db,
                                        collection_name=name, collectionID=cid, partitionID=-1, num_rows=len(keys))
            req.primary_keys.int_id.data.extend(keys)
            req.timestamps.extend([ts] * len(keys))
            self._send(i, req, {"msg_type": "Delete"}, ts)
            for pk in keys:
                self.expected[(db, name, cid)].pop(pk, None)
            if cid in self.models:
                self.models[cid].remove(keys, ts)

    def upsert(self, cid: int, pks, gen: int) -> None:
        """The proxy's upsert: an Insert, then a Delete of the same keys, one timestamp (the insert wins)."""
        ts = next(self._ts)
        db, name = self.colls[cid]
        for i, keys in self._shards(pks).items():
            req = msg_pb2.DeleteRequest(base=_base(401, ts, next(self._ids)), shardName=self._vch(cid, i), db_name=db,
                                        collection_name=name, collectionID=cid, partitionID=-1, num_rows=len(keys))
            req.primary_keys.int_id.data.extend(keys)
            req.timestamps.extend([ts] * len(keys))
            self.insert(cid, keys, gen, ts)
            self._send(i, req, {"msg_type": "Delete"}, ts)

    def tick(self) -> None:
        ts = next(self._ts)
        for i in range(len(self.pchannels)):
            self._send(i, msg_pb2.TimeTickMsg(base=_base(1200, ts)), {}, ts)

    def close(self) -> None:
        for p in self.producers:
            p.close()


def table_rows(location) -> dict[int, dict]:
    """A Delta table's rows by pk, read by delta-rs (not this project's table code); a pk found twice fails."""
    dt = deltalake.DeltaTable(str(location))
    t = pa.table(deltalake.QueryBuilder().register("t", dt).execute("SELECT pk, s, fv FROM t").read_all())
    out: dict[int, dict] = {}
    for r in t.to_pylist():
        assert r["pk"] not in out, f"pk {r['pk']} twice in {location}"
        out[r["pk"]] = r
    return out


def drop_partition_scenario(local_env, prefix: str, coll: tuple[str, str, int], location: Path,
                            run: Callable[[list[str], int], dict]) -> tuple[dict, dict]:
    """2.3-2.5's DropPartition (RootCoord's GC step, a copy on each of the collection's pchannels) for one job.

    Collection ``coll`` (db, name, id) on two new channels named from ``prefix``: rows in ``_default`` and in
    partition ``id * 10 + 1``; run 1 (``run(channels, 1)``) writes them to the table at ``location``. Then, in one
    batch: more rows of that partition, an upsert, the drop, and rows of another partition after it; run 2 applies
    them, run 3 finds nothing new. Every row of the dropped partition has left the table (those run 1 wrote and
    those of the drop's batch before it); the rows after the drop stay. Returns runs 2 and 3's results."""
    db, name, cid = coll
    part = cid * 10 + 1
    chans = [local_env.new_channel(prefix) for _ in range(2)]
    with local_env.client() as c:
        log = ManyLog(c, chans)
        log.create(db, name, cid)
        log.insert(cid, range(0, 10))
        log.insert(cid, range(10, 20), partition=part)
        log.tick()
        run(chans, 1)
        assert table_rows(location) == log.expected[coll]
        log.insert(cid, range(20, 25), partition=part)  # same batch as the drop, before it
        log.upsert(cid, [3], gen=1)
        log.drop_partition(cid, part)
        log.insert(cid, [10, 11], gen=2, partition=part + 1)  # after the drop (another partition): stays
        log.tick()
        out = run(chans, 2)
        again = run(chans, 3)
        log.close()
    want = log.expected[coll]
    assert sorted(want) == [*range(0, 10), 10, 11]
    assert table_rows(location) == want
    return out, again


def proxied_config(local_env, milvus_proxy, tmp_path: Path, databases: set[str]) -> str:
    """A config file for ``local_env`` whose Milvus is the suite's proxy, which lists ``databases``."""
    cfg = Path(config_file(local_env, tmp_path))
    cfg.write_text(yaml.safe_dump({**yaml.safe_load(cfg.read_text()), "milvus.address": milvus_proxy.address}))
    milvus_proxy.state.databases |= databases
    return str(cfg)


@dataclass
class DatabaseJob:
    """A ``--database db1 --snapshot initial`` job over two new channels, Milvus being the suite's proxy: a
    collection it finds listed there and not yet mirrored is snapshotted at its own S, then streamed."""

    chans: list[str]
    root: Path  # the table root: ``root / db / name`` per collection
    argv: list[str]  # the job's arguments
    state: object  # the proxy's state (``ManyLog.listed`` lists a collection in it)


def database_job(local_env, milvus_proxy, tmp_path: Path, prefix: str) -> DatabaseJob:
    chans = [local_env.new_channel(prefix) for _ in range(2)]
    cfg = proxied_config(local_env, milvus_proxy, tmp_path, {"db1"})
    root = tmp_path / "lake"
    argv = ["--config", cfg, "--database", "db1", "--table-root", str(root), "--table-format", "delta",
            "--snapshot", "initial", "--channels", ",".join(chans), "--progress-interval", "1"]
    return DatabaseJob(chans, root, argv, milvus_proxy.state)


def listed_collections(log: ManyLog, state, *colls: tuple[str, str, int]) -> None:
    """Each collection (db, name, id) created on the log and listed in the suite proxy's ``state``."""
    for db, name, cid in colls:
        log.create(db, name, cid)
        log.listed(state, db, name, cid)


def two_pending(log: ManyLog, state, a: int, b: int) -> None:
    """The setup of a snapshot beside the stream: db1.a (id ``a``) and db1.b (id ``b``) on the log and in Milvus
    (the suite proxy's ``state``, which lists database db1), rows 0..9 in each, a tick. A new ``--database db1
    --snapshot initial`` job snapshots both; a test holds b's (its first Query) to see what happens meanwhile."""
    state.databases |= {"db1"}
    listed_collections(log, state, ("db1", "a", a), ("db1", "b", b))
    log.insert(a, range(10))
    log.insert(b, range(10))
    log.tick()


def rounds_log(local_env, chans: list[str], names: dict[int, str], rounds: int,
               each: Callable[[ManyLog, int], None] | None = None) -> ManyLog:
    """Collections ``names`` (id -> name) of db1 created, a tick, then ``rounds`` rounds: each inserts key
    ``id * 100 + round`` into every collection, runs ``each(log, round)`` if given, and ends with a tick (its own
    batch with a small ``--max-rows-per-trigger``). The log is closed; its ``expected`` is what each holds."""
    with local_env.client() as c:
        log = ManyLog(c, chans)
        try:
            for cid, name in names.items():
                log.create("db1", name, cid)
            log.tick()
            for r in range(rounds):
                for cid in names:
                    log.insert(cid, [cid * 100 + r])
                if each is not None:
                    each(log, r)
                log.tick()
        finally:
            log.close()
    return log


def two_collections(local_env, prefix: str) -> tuple[list[str], int]:
    """Two channels holding db1.a (id 11) and db2.b (id 12): created, inserts, a tick, a delete of a's and an
    upsert of b's, b dropped, a tick; (the channels, the drop's timestamp)."""
    chans = [local_env.new_channel(prefix) for _ in range(2)]
    with local_env.client() as c:
        log = ManyLog(c, chans)
        log.create("db1", "a", 11)
        log.create("db2", "b", 12)
        log.insert(11, range(6))
        log.insert(12, range(3))
        log.tick()
        log.delete(11, [1, 4])
        log.upsert(12, [2], gen=1)
        drop_ts = log.drop(12)
        log.tick()
        log.close()
    return chans, drop_ts
