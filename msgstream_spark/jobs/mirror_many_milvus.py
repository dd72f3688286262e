"""What the many-collection job asks Milvus (config key ``milvus.address``): every collection with its database
and id, a collection's schema, and a collection id's database when the stream does not name it."""
from __future__ import annotations

import logging
from dataclasses import replace

from msgstream_spark.errors import MirrorError

log = logging.getLogger("msgstream_spark.jobs.mirror")  # the job's logger


def milvus_collections(cfg) -> list[tuple[str, str, int]]:
    """(database, collection, id) of every collection in Milvus (config key ``milvus.address``)."""
    from msgstream_spark.mirror.snapshot.handover import milvus_target

    target = milvus_target(cfg, "(every selected collection)")
    mc = target.client()
    try:
        dbs = mc.list_databases()
    finally:
        mc.close()
    out = []
    for db in dbs:
        mc = replace(target, db=db).client()
        try:
            out += [(db, n, int(mc.describe_collection(n)["collection_id"])) for n in mc.list_collections()]
        finally:
            mc.close()
    return out


def described_schema(cfg, db: str, name: str) -> bytes:
    """The serialized ``CollectionSchema`` Milvus's DescribeCollection gives for ``db.name`` (a collection whose
    creation the stream may no longer hold)."""
    from pymilvus.grpc_gen import milvus_pb2

    from msgstream_spark.mirror.snapshot.handover import milvus_target

    target = replace(milvus_target(cfg, name), db=db)
    mc = target.client()
    try:
        req = milvus_pb2.DescribeCollectionRequest(db_name=db, collection_name=name)
        resp = mc._get_connection()._stub.DescribeCollection(req, timeout=target.timeout)
    finally:
        mc.close()
    if resp.status.code != 0 or not resp.schema.fields:
        raise MirrorError(f"collection {db}.{name}: Milvus at milvus.address did not describe it "
                          f"({resp.status.reason or 'no schema'})")
    return resp.schema.SerializeToString()


class Locate:
    """A collection id -> its database, as Milvus lists them (``milvus.address``; listed again on a miss). A
    collection id Milvus did not answer for is asked once: its CreateCollection comes once per channel (2.3-2.5:
    a copy on each of its pchannels), and each ask of an unreachable Milvus waits for its connect timeout."""

    def __init__(self, cfg) -> None:
        self.cfg, self.ids = cfg, {}
        self.unanswered: set[int] = set()

    def __call__(self, cid: int) -> str | None:
        if cid in self.unanswered:
            return None
        if cid not in self.ids:
            try:
                self.ids.update({c: db for db, _, c in milvus_collections(self.cfg)})
            except Exception as exc:  # noqa: BLE001 - any SDK failure: the stream's answer stands, said loudly
                log.warning("collection id %d: the stream names no database and Milvus at milvus.address did not "
                            "answer (%s): taking the database its inserts name (empty: default)", cid, exc)
                self.unanswered.add(cid)
                return None
        db = self.ids.get(cid)
        log.info("collection id %d: the stream names no database; Milvus answers %r", cid, db)
        return db
