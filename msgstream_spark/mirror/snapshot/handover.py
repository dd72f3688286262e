"""The initial snapshot of a collection: positions first, then S, then rows through Milvus's ``Query``.

Spark-free. :func:`take_positions` records each channel's last message (its id, and the newest Milvus time
of the messages up to it) *before* any row is read; S is the newest of those times. Every query of the
snapshot then carries S as its ``guarantee_timestamp`` (mirror/snapshot/query/rpc.py): Milvus's query node
answers it at its own safe time, once that time has reached S, so every write up to S is seen. The stream
then starts after the positions, and the merge keeps the newest change per primary key with snapshot rows
counting as changes at S: see "The handover" in the README for the argument.

Where Milvus pins iterator reads (:func:`probe_pin`: late 2.4, 2.5+), every range is read at exactly
S instead (``iterator``, ``collection_id``, ``guarantee_timestamp=S``): the rows are the collection at S.
Milvus 2.3.5 does not pin: each range is read at its own time >= S, and the handover's argument covers
it. The ranges and their reading are mirror/snapshot/query/reader.py's; the answers' decoding
mirror/snapshot/query/answer.py's.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.snapshot.query.ranges import PkRange
from msgstream_spark.mirror.snapshot.query.rpc import CollectionChanged, Querier, QueryTarget
from msgstream_spark.mq.milvus.channels import partitions
from msgstream_spark.mq.milvus.connection import ProxyConnection
from msgstream_spark.mq.milvus.settings import MilvusSettings
from msgstream_spark.msg.position import MsgPosition
from msgstream_spark.stream.timeseek import message_time, newest_time_through

log = logging.getLogger(__name__)



# -- where Milvus is -----------------------------------------------------------------------------
@dataclass(frozen=True)
class MilvusTarget:
    """How to reach the collection through pymilvus (plain data: Spark tasks get a copy)."""

    address: str
    collection: str
    token: str = ""
    db: str = ""
    timeout: float = 60.0

    @property
    def uri(self) -> str:
        a = self.address.strip()
        return a if "://" in a else f"http://{a}"

    def client(self):
        kw: dict[str, Any] = {"uri": self.uri, "timeout": self.timeout}
        if self.token:
            kw["token"] = self.token
        if self.db:
            kw["db_name"] = self.db
        from pymilvus import MilvusClient  # lazily: the CLI starts without loading the SDK (and pandas)

        try:
            return MilvusClient(**kw)
        except Exception as exc:  # noqa: BLE001 - pymilvus raises its own tree; name the address
            raise MirrorError(f"cannot connect to Milvus at {self.address} (config key milvus.address) for the "
                              f"snapshot of collection {self.collection!r}: {exc}") from exc


def milvus_target(config, collection: str, purpose: str = "snapshot") -> MilvusTarget:
    """The SDK address from config key ``milvus.address``; set explicitly (the config file,
    ``MSGSTREAM_MILVUS_ADDRESS``, an option), never the built-in default. ``purpose``: "snapshot"
    (``mirror run``, which can do without one) or "verify" (``mirror verify``)."""
    if not config.is_set("milvus.address") or not config.get_str("milvus.address"):
        what = "a snapshot of" if purpose == "snapshot" else "mirror verify of"
        alt = "; or use --snapshot never" if purpose == "snapshot" else ""
        unread = (" (MILVUS_ADDRESS in the environment is not read: a key of this project's milvus section takes "
                  "the MSGSTREAM_ prefix)" if os.environ.get("MILVUS_ADDRESS") else "")
        raise MirrorError(f"{what} collection {collection!r} reads it through Milvus's SDK, but config key "
                          f"milvus.address is not set in {config.source}{unread}: set it to the proxy, e.g. "
                          f"milvus.address: host:19530 in the config, MSGSTREAM_MILVUS_ADDRESS=host:19530 in the "
                          f"environment, or --option milvus.address=host:19530{alt}")
    token = config.get_str("milvus.token") or (
        f"{config.get_str('milvus.user')}:{config.get_str('milvus.password')}" if config.get_str("milvus.user") else "")
    return MilvusTarget(config.get_str("milvus.address"), collection, token, config.get_str("milvus.database"),
                        float(config.get("milvus.requesttimeout") or 60))


# -- what the collection is --------------------------------------------------------------------
@dataclass(frozen=True)
class CollectionInfo:
    collection_id: int
    pk: str
    pk_is_string: bool
    fields: tuple[str, ...]  # declared fields, without the dynamic one
    dynamic: bool
    row_count: int
    partition_key: bool = False  # a partition-key collection: its partitions cannot be named in a query


def describe(target: MilvusTarget, mc=None, count: bool = True) -> CollectionInfo:
    """The collection's id, key and fields, and its row count (a Strong ``count(*)``; -1 without ``count``,
    when the caller counts at its own time)."""
    from pymilvus import DataType

    own = mc is None
    mc = mc or target.client()
    try:
        if not mc.has_collection(target.collection):
            raise MirrorError(f"collection {target.collection!r} does not exist in Milvus at {target.address}")
        d = mc.describe_collection(target.collection)
        pkf = next(f for f in d["fields"] if f.get("is_primary"))
        names = tuple(f["name"] for f in d["fields"] if not f.get("is_dynamic"))
        rows = _row_count(target, mc) if count else -1
        return CollectionInfo(int(d["collection_id"]), pkf["name"], pkf["type"] == DataType.VARCHAR, names,
                              bool(d.get("enable_dynamic_field")), rows,
                              any(f.get("is_partition_key") for f in d["fields"]))
    finally:
        if own:
            mc.close()


def _row_count(target: MilvusTarget, mc) -> int:
    try:
        got = mc.query(target.collection, "", output_fields=["count(*)"], consistency_level="Strong")
    except Exception as exc:  # noqa: BLE001 - a collection not loaded answers with an error
        raise MirrorError(f"cannot query collection {target.collection!r} at {target.address} for the "
                          f"snapshot (is it loaded?): {exc}") from exc
    return int(got[0]["count(*)"])


# -- positions, then S --------------------------------------------------------------------------
def take_positions(client, channels: list[str], timeout: float = 10.0) -> dict[str, MsgPosition | None]:
    """Each channel's last message as a position (None: an empty channel) at the newest Milvus time of the
    messages up to it (:func:`~msgstream_spark.stream.timeseek.newest_time_through`), not the last message's
    own: that is often a TimeTick older than data before it (on Milvus 2.3.5 even between an upsert's Insert
    and Delete), which a resume from the position never reads and a snapshot read at the tick's time misses.
    With the newest time every message before a position is at or before S: the snapshot holds it."""
    out: dict[str, MsgPosition | None] = {}
    for ch in channels:
        mid = client.latest_message_id(ch)
        if mid is None:
            out[ch] = None
            continue
        reader = client.reader(ch)
        try:
            reader.seek(mid, inclusive=True)
            got = reader.receive_batch(1, timeout)
        finally:
            reader.unsubscribe()
        if not got:
            raise MirrorError(f"channel {ch}: the last message ({mid}) could not be read within {timeout}s")
        ts = newest_time_through(client, ch, mid, message_time(got[0].payload, got[0].properties) or 0)
        out[ch] = MsgPosition(ch, mid.serialize(), "", int(ts))
    return out


def snapshot_ts(positions: Mapping[str, MsgPosition | None]) -> int:
    """S: the newest Milvus time among the positions (0 when every channel is empty)."""
    return max((p.timestamp for p in positions.values() if p is not None), default=0)


def starting_positions(positions: Mapping[str, MsgPosition | None]) -> str:
    """The stream's ``startingPositions``: after each position (Milvus-style resume), earliest if empty."""
    return json.dumps({ch: (p.to_base64() if p is not None else "earliest") for ch, p in sorted(positions.items())})


# -- how the snapshot reads ---------------------------------------------------------------------
def query_target(config, info: CollectionInfo, collection: str) -> QueryTarget:
    """Where the tasks send their queries (config keys ``milvus.*``: address, credentials, TLS, timeout)."""
    return QueryTarget(MilvusSettings(config), collection, info.collection_id)


def probe_pin(q: Querier, info: CollectionInfo) -> bool:
    """Whether the server pins iterator reads: an iterator query's first page reports ``session_ts``
    (Milvus late 2.4 / 2.5+); Milvus 2.3.5 reports none, and each query then reads at its own time."""
    try:
        return q.session_ts(PkRange().expr(info.pk, info.pk_is_string)) > 0
    except CollectionChanged:
        raise
    except MirrorError as exc:  # a server that refuses the iterator flag cannot pin: say why, read unpinned
        log.warning("snapshot of %s: the iterator probe failed, reads are not pinned: %s", q.target.where(), exc)
        return False


def check_same_collection(target: MilvusTarget, info: CollectionInfo) -> None:
    """CollectionChanged if the name now resolves to another collection id (a server that ignores the
    ``collection_id`` query parameter, as 2.3.5 does, is checked this way after the read)."""
    mc = target.client()
    try:
        now = int(mc.describe_collection(target.collection)["collection_id"]) if mc.has_collection(
            target.collection) else None
    finally:
        mc.close()
    if now != info.collection_id:
        raise CollectionChanged(f"collection {target.collection!r} had id {info.collection_id} when the snapshot "
                                f"started and {'is gone' if now is None else f'has id {now}'} now: it was dropped "
                                "(and re-created) during the snapshot; nothing was registered")


def collection_partitions(config, info: CollectionInfo, collection: str) -> list[tuple[str, int]] | None:
    """The collection's partitions (name, id) from Milvus's ``ShowPartitions`` through this project's own
    proxy client (pymilvus lists names only; rows carry ids). None for a partition-key collection: Milvus
    refuses queries that name its partitions, so its snapshot rows keep ``_partition`` null."""
    if info.partition_key:
        return None
    settings = MilvusSettings(config)
    conn = ProxyConnection(settings)
    try:
        return partitions(conn, settings.database, collection)
    finally:
        conn.close()
