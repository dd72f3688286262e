"""Several collections in several databases on shared pchannels, written as Milvus 2.6's streaming WAL writes them,
and the rows each collection must hold.

Written from shared/docs (milvus-26-wal-format.md §1-§8, service-notes.md §1.1-§1.6, milvus-wire-format.md §5.4),
with the 2.6 test producer's own wire writer (tests/wal26/producer.py: properties, headers, base 36) and Milvus's
generated ``msgpb`` bodies, not the project's encoder:

- a message is a payload plus properties (``_v``, ``_t``, ``_tt``, ``_vc``, ``_h``; ``_bh`` on a broadcast, ``_tx`` in
  a transaction); a TimeTick has no ``_vc`` and closes each step on every pchannel;
- a row goes to vchannel ``<pchannel i>_<id>v<i>``, ``i`` = murmur3_x86_32 of the 8-byte little-endian key
  (seed 0) & 0x7fffffff modulo the shard count (computed here with ``mmh3``, not the project's hash);
- the 2.6.6+ DDL framework (``form="2.6.6"``) broadcasts each collection DDL to the cluster's control vchannel
  ``<pchannel 0>_vcchan`` and to every vchannel of the collection, one ``_bh`` for all copies, each copy at its own
  ``_tt``: CreateCollection with ``db_name``, ``collectionName``, ``dbID`` and the schema in field #13 (``schema``
  #8 empty), header ``{collection_id, partition_ids, db_id}``; DropCollection / DropPartition with the names;
  AlterCollection (V2) with an ``update_mask`` of ``schema`` or ``collection_name`` / ``db``; TruncateCollection
  (V2, 38, header ``{db_id, collection_id, segment_ids}``, empty body, since 2.6.11);
- 2.6.0-2.6.5 (``form="2.6.0"``) write one copy per vchannel with ``_btt``, no ``_bh``, no control copy; the
  CreateCollection names no database and no collection (the name is the schema's, in #8), its header no ``db_id``;
- an upsert is a transaction per vchannel: BeginTxn, a Delete and an Insert of the same keys, CommitTxn (the rows
  take the commit's ``_tt``); proxies' payload timestamps are not the ``_tt``.
"""

from __future__ import annotations

import itertools
import time

import mmh3

from msgstream_spark.mq.base import ProducerMessage
from msgstream_spark.msg.pb import common_pb2, msg_pb2, schema_pb2
from tests.milvus_proxy.query import columns
from tests.mirror_job.many_log import row, schema
from tests.wal26 import producer as P

NEW, OLD = "2.6.6", "2.6.0"
_SKEW = P.PAYLOAD_TS_SKEW


def _base(t: int, ts: int) -> common_pb2.MsgBase:
    return common_pb2.MsgBase(msg_type=t, timestamp=ts - _SKEW, sourceID=9)


def shard_of(pk: int, shards: int) -> int:
    """Milvus's shard of an Int64 key (milvus-wire-format.md §5.4), through ``mmh3``."""
    return (mmh3.hash(int(pk).to_bytes(8, "little", signed=True), 0, signed=False) & 0x7FFFFFFF) % shards


class WalLog:
    """The pchannels' producers; ``expected[id]``: {pk: row} each collection holds now; ``names[id]``: (db, name)."""

    def __init__(self, client, pchannels: list[str]) -> None:
        self.pchannels = list(pchannels)
        self.control = f"{self.pchannels[0]}_vcchan"
        self.producers = [client.create_producer(p) for p in pchannels]
        self.client = client
        self.homes: dict[int, list[str]] = {}  # id -> the pchannels of its vchannels (fixed at its creation)
        self.names: dict[int, tuple[str, str]] = {}
        self.forms: dict[int, str] = {}
        self.db_ids: dict[str, int] = {"default": 1}
        self.schemas: dict[int, schema_pb2.CollectionSchema] = {}
        self.expected: dict[int, dict[int, dict]] = {}
        self.partition_of: dict[tuple[int, int], int] = {}
        self._tt = itertools.count((int(time.time() * 1000) << 18), 1 << 18)
        self._ids = itertools.count(1)

    # -- sending -------------------------------------------------------------------------------------------
    def _send(self, vc: str | None, payload: bytes, props: dict, tt: int, pchannel: int | None = None) -> None:
        i = pchannel if pchannel is not None else self._pchannel_of(vc)
        self.producers[i].send_batch([ProducerMessage(payload, props, tt)])

    def _pchannel_of(self, vc: str) -> int:
        return 0 if vc == self.control else self.pchannels.index(vc.rsplit("_", 1)[0])

    def _vch(self, cid: int, i: int) -> str:
        return f"{self.homes[cid][i]}_{cid}v{i}"

    def _vchannels(self, cid: int) -> list[str]:
        return [self._vch(cid, i) for i in range(len(self.homes[cid]))]

    def add_pchannel(self, name: str) -> None:
        """A pchannel added while the cluster runs (2.6.12+: ``rootCoord.dmlChannelNum`` raised online)."""
        self.pchannels.append(name)
        self.producers.append(self.client.create_producer(name))

    def _ddl(self, cid: int, t: int, payload: bytes, header: bytes, *, version: int = 1, sync: bool = False,
             copies: list[str] | None = None, broadcast_id: int | None = None) -> None:
        """One collection DDL as the collection's form writes it: 2.6.6+ a broadcast to the control vchannel and
        every vchannel (one ``_bh``; ``copies``: only these of its copies now, the others by a later call with the
        same ``broadcast_id``); 2.6.0-2.6.5 one copy per vchannel with ``_btt``."""
        db, name = self.names[cid]
        if self.forms[cid] == NEW:
            vcs = [self.control, *self._vchannels(cid)]
            bid = broadcast_id or next(self._ids)
            bh = P.broadcast_header(bid, vcs, [(3, db, True), (2, f"{db}.{name}", False)])
            bh += P.vfield(4, sync)  # ack_sync_up (a truncate's)
            for vc in copies or vcs:
                tt = next(self._tt)
                self._send(vc, payload, P.props(t, tt, vc=vc, header=header, version=version, bh=bh), tt)
        else:
            barrier = next(self._tt)
            for vc in self._vchannels(cid):
                tt = next(self._tt)
                self._send(vc, payload, P.props(t, tt, vc=vc, header=header, version=version, _btt=P.b36(barrier)),
                           tt)

    # -- DDL -----------------------------------------------------------------------------------------------
    def create(self, db: str, name: str, cid: int, form: str = NEW, on: list[str] | None = None) -> None:
        """The collection's vchannels: one per pchannel of ``on`` (default: every pchannel now)."""
        self.names[cid], self.forms[cid] = (db, name), form
        self.homes[cid] = list(on or self.pchannels)
        self.schemas[cid] = schema(name)
        self.db_ids.setdefault(db, len(self.db_ids) + 1)
        tt = next(self._tt)
        req = msg_pb2.CreateCollectionRequest(
            base=_base(100, tt), collectionID=cid, partitionIDs=[cid * 10], physicalChannelNames=self.homes[cid],
            virtualChannelNames=self._vchannels(cid))
        header = P.vfield(1, cid) + P.packed(2, [cid * 10])
        if form == NEW:  # names, database and the schema in #13
            req.db_name, req.collectionName, req.dbID = db, name, self.db_ids[db]
            req.partitionNames.append("_default")
            req.collection_schema.CopyFrom(self.schemas[cid])
            header += P.vfield(3, self.db_ids[db])
        else:  # 2.6.0-2.6.5: the schema's bytes in #8, no names
            req.schema = self.schemas[cid].SerializeToString()
        self._ddl(cid, P.T["CreateCollection"], req.SerializeToString(), header)
        self.expected[cid] = {}

    def drop(self, cid: int) -> None:
        db, name = self.names[cid]
        req = msg_pb2.DropCollectionRequest(base=_base(101, next(self._tt)), collectionName=name, collectionID=cid)
        header = P.vfield(1, cid)
        if self.forms[cid] == NEW:
            req.db_name, req.dbID = db, self.db_ids[db]
            header += P.vfield(2, self.db_ids[db])
        self._ddl(cid, P.T["DropCollection"], req.SerializeToString(), header)

    def drop_partition(self, cid: int, pid: int) -> None:
        db, name = self.names[cid]
        req = msg_pb2.DropPartitionRequest(base=_base(201, next(self._tt)), partition_name=f"p{pid}",
                                           collectionID=cid, partitionID=pid)
        if self.forms[cid] == NEW:
            req.db_name, req.collection_name, req.dbID = db, name, self.db_ids[db]
        self._ddl(cid, P.T["DropPartition"], req.SerializeToString(), P.vfield(1, cid) + P.vfield(2, pid))
        rows = self.expected[cid]
        for pk in [k for k in rows if self.partition_of.get((cid, k)) == pid]:
            del rows[pk]

    def truncate(self, cid: int, shards: list[int] | None = None, broadcast_id: int | None = None) -> None:
        """TruncateCollection (2.6.11+): every row before it is gone, each vchannel's at its copy. ``shards``:
        only the copies of these vchannels now (the first call also the control vchannel's), the rest later."""
        db, _ = self.names[cid]
        header = P.vfield(1, self.db_ids[db]) + P.vfield(2, cid) + P.packed(3, [cid * 1000 + 1])
        copies = None if shards is None else [
            *([self.control] if broadcast_id is None else []), *(self._vch(cid, i) for i in shards)]
        self._ddl(cid, P.T["TruncateCollection"], b"", header, version=2, sync=True, copies=copies,
                  broadcast_id=broadcast_id)
        n = len(self.homes[cid])
        for pk in [k for k in self.expected[cid] if shards is None or shard_of(k, n) in shards]:
            del self.expected[cid][pk]

    def _alter(self, cid: int, paths: list[str], updates: bytes) -> None:
        db, _ = self.names[cid]
        mask = b"".join(P.lfield(1, p) for p in paths)
        header = P.vfield(1, self.db_ids[db]) + P.vfield(2, cid) + P.lfield(3, mask)
        self._ddl(cid, P.T["AlterCollection"], P.lfield(1, updates), header, version=2)

    def add_field(self, cid: int, field: str) -> None:
        """AlterCollection with mask ``schema``: the full new schema, ``field`` a nullable VarChar."""
        s = schema_pb2.CollectionSchema()
        s.CopyFrom(self.schemas[cid])
        f = s.fields.add(fieldID=100 + len(s.fields), name=field, data_type=schema_pb2.DataType.VarChar, nullable=True)
        f.type_params.add(key="max_length", value="64")
        self.schemas[cid] = s
        self._alter(cid, ["schema"], P.lfield(5, s.SerializeToString()))

    def rename(self, cid: int, name: str | None = None, db: str | None = None) -> None:
        """AlterCollection with mask ``collection_name`` and/or ``db`` (2.6.6+ only)."""
        old_db, old_name = self.names[cid]
        new_db, new_name = db or old_db, name or old_name
        self.db_ids.setdefault(new_db, len(self.db_ids) + 1)
        paths = (["collection_name"] if name else []) + (["db"] if db else [])
        updates = P.vfield(1, self.db_ids[new_db]) + P.lfield(2, new_db) + P.lfield(3, new_name)
        self._alter(cid, paths, updates)
        self.names[cid] = (new_db, new_name)

    # -- DML -----------------------------------------------------------------------------------------------
    def _shards(self, cid: int, pks) -> dict[int, list[int]]:
        out: dict[int, list[int]] = {}
        for pk in pks:
            out.setdefault(shard_of(pk, len(self.homes[cid])), []).append(pk)
        return out

    def _insert_msg(self, cid: int, i: int, rows: list[dict], pid: int, tt: int, **kw) -> P.Built:
        db, name = self.names[cid]
        req = msg_pb2.InsertRequest(
            base=_base(400, tt), shardName="proxy-shard", db_name="" if db == "default" else db,
            collection_name=name, partition_name="_default" if pid == cid * 10 else f"p{pid}", collectionID=cid,
            partitionID=pid, num_rows=len(rows), fields_data=columns(self.schemas[cid], rows),
            version=msg_pb2.InsertDataVersion.ColumnBased)
        req.timestamps.extend([tt - _SKEW] * len(rows))
        req.rowIDs.extend(next(self._ids) for _ in rows)
        header = P.insert_header(cid, [(pid, len(rows), 64 * len(rows), pid * 100 + 1)])
        vc = self._vch(cid, i)
        return P.Built(req.SerializeToString(), P.props(P.T["Insert"], tt, vc=vc, header=header, **kw), tt)

    def _delete_msg(self, cid: int, i: int, keys: list[int], tt: int, **kw) -> P.Built:
        db, name = self.names[cid]
        req = msg_pb2.DeleteRequest(base=_base(401, tt), shardName="proxy-shard", db_name="" if db == "default"
                                    else db, collection_name=name, collectionID=cid, partitionID=-1,
                                    num_rows=len(keys))
        req.primary_keys.int_id.data.extend(keys)
        req.timestamps.extend([tt - _SKEW] * len(keys))
        header = P.delete_header(cid, len(keys))
        return P.Built(req.SerializeToString(), P.props(P.T["Delete"], tt, vc=self._vch(cid, i), header=header, **kw),
                       tt)

    def _rows(self, cid: int, keys: list[int], gen: int, extra: dict | None) -> list[dict]:
        return [{**row(self.names[cid][1], pk, gen), **(extra or {})} for pk in keys]

    def _keep(self, cid: int, rows: list[dict], pid: int) -> None:
        names = {f.name for f in self.schemas[cid].fields}
        self.expected[cid].update({r["pk"]: {k: v for k, v in r.items() if k in names} for r in rows})
        self.partition_of.update({(cid, r["pk"]): pid for r in rows})

    def insert(self, cid: int, pks, gen: int = 0, partition: int | None = None, extra: dict | None = None) -> None:
        pid = partition or cid * 10
        for i, keys in self._shards(cid, pks).items():
            rows = self._rows(cid, keys, gen, extra)
            m = self._insert_msg(cid, i, rows, pid, next(self._tt))
            self._send(self._vch(cid, i), m.payload, m.properties, m.tt)
            self._keep(cid, rows, pid)

    def delete(self, cid: int, pks) -> None:
        for i, keys in self._shards(cid, pks).items():
            m = self._delete_msg(cid, i, keys, next(self._tt))
            self._send(self._vch(cid, i), m.payload, m.properties, m.tt)
            for pk in keys:
                self.expected[cid].pop(pk, None)

    def upsert(self, cid: int, pks, gen: int, extra: dict | None = None) -> None:
        """Per vchannel a transaction: BeginTxn, Delete, Insert of the same keys, CommitTxn."""
        for i, keys in self._shards(cid, pks).items():
            vc, txn = self._vch(cid, i), next(self._ids)
            rows = self._rows(cid, keys, gen, extra)
            msgs = [P.begin_txn(next(self._tt), txn, vc=vc),
                    P.in_txn(self._delete_msg(cid, i, keys, next(self._tt)), txn),
                    P.in_txn(self._insert_msg(cid, i, rows, cid * 10, next(self._tt)), txn),
                    P.commit_txn(next(self._tt), txn, vc=vc)]
            for m in msgs:
                self._send(vc, m.payload, m.properties, m.tt)
            self._keep(cid, rows, cid * 10)

    def tick(self) -> None:
        tt = next(self._tt)
        for i in range(len(self.pchannels)):
            m = P.timetick(tt)
            self._send(None, m.payload, m.properties, tt, pchannel=i)

    def close(self) -> None:
        for p in self.producers:
            p.close()
