"""The initial snapshot of a collection: positions first, then S, then rows through Milvus's SDK.

Spark-free. :func:`take_positions` records each channel's last message (id and Milvus time) *before*
any row is read; S is the newest of those times. Every Strong query issued afterwards sees at least
every write up to S (Milvus's proxy allocates the guarantee timestamp at the query, later than any
message already in the log). The stream then starts after the positions, and the merge keeps the
newest change per primary key with snapshot rows counting as changes at S: see "The handover" in
the README for the argument.

Reads are split by primary-key ranges, never by offsets (Milvus caps ``offset + limit`` at 16384):
a range whose query comes back full is cut at the median of the keys it returned and read again in
halves, so a task is correct whatever the planner guessed. On Milvus 2.3.5 the literal
``-9223372036854775808`` does not parse, so an open range is written without its lower bound.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import pyarrow as pa
import yaml
from pymilvus import DataType, MilvusClient

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.common import PARTITION, TS
from msgstream_spark.mirror.order import SEQ, snapshot_seq_array
from msgstream_spark.mq.milvus.channels import partitions
from msgstream_spark.mq.milvus.connection import ProxyConnection
from msgstream_spark.mq.milvus.settings import MilvusSettings
from msgstream_spark.msg.position import MsgPosition
from msgstream_spark.stream.timeseek import message_time

log = logging.getLogger(__name__)

QUERY_CAP = 16384  # Milvus's default queryNode maxOutputSize window: offset + limit
META = "$meta"


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
        try:
            return MilvusClient(**kw)
        except Exception as exc:  # noqa: BLE001 - pymilvus raises its own tree; name the address
            raise MirrorError(f"cannot connect to Milvus at {self.address} (config key milvus.address) for the "
                              f"snapshot of collection {self.collection!r}: {exc}") from exc


def _explicit_keys(config_path: str | None, overrides: Mapping[str, Any]) -> set[str]:
    keys = {str(k).lower() for k in overrides}
    if config_path:
        with open(config_path) as f:
            data = yaml.safe_load(f) or {}
        stack = [("", data)]
        while stack:
            prefix, d = stack.pop()
            for k, v in (d.items() if isinstance(d, Mapping) else []):
                if isinstance(v, Mapping):
                    stack.append((f"{prefix}{str(k).lower()}.", v))
                else:
                    keys.add(f"{prefix}{str(k).lower()}")
    if os.environ.get("MILVUS_ADDRESS"):
        keys.add("milvus.address")
    return keys


def milvus_target(config, config_path: str | None, overrides: Mapping[str, Any], collection: str) -> MilvusTarget:
    """The SDK address from config key ``milvus.address``; set explicitly, never the built-in default."""
    if "milvus.address" not in _explicit_keys(config_path, overrides) or not config.get_str("milvus.address"):
        where = config_path or "the packaged default config"
        raise MirrorError(f"a snapshot of collection {collection!r} reads it through Milvus's SDK, but config key "
                          f"milvus.address is not set in {where} (set it to the proxy, e.g. milvus.address: "
                          f"host:19530, or --option milvus.address=host:19530; or use --snapshot never)")
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


def describe(target: MilvusTarget, mc=None) -> CollectionInfo:
    """The collection's id, key and fields, and its row count (a Strong ``count(*)``)."""
    own = mc is None
    mc = mc or target.client()
    try:
        if not mc.has_collection(target.collection):
            raise MirrorError(f"collection {target.collection!r} does not exist in Milvus at {target.address}")
        d = mc.describe_collection(target.collection)
        pkf = next(f for f in d["fields"] if f.get("is_primary"))
        names = tuple(f["name"] for f in d["fields"] if not f.get("is_dynamic"))
        try:
            got = mc.query(target.collection, "", output_fields=["count(*)"], consistency_level="Strong")
        except Exception as exc:  # noqa: BLE001 - a collection not loaded answers with an error
            raise MirrorError(f"cannot query collection {target.collection!r} at {target.address} for the "
                              f"snapshot (is it loaded?): {exc}") from exc
        return CollectionInfo(int(d["collection_id"]), pkf["name"], pkf["type"] == DataType.VARCHAR, names,
                              bool(d.get("enable_dynamic_field")), int(got[0]["count(*)"]),
                              any(f.get("is_partition_key") for f in d["fields"]))
    finally:
        if own:
            mc.close()


# -- positions, then S --------------------------------------------------------------------------
def take_positions(client, channels: list[str], timeout: float = 10.0) -> dict[str, MsgPosition | None]:
    """Each channel's last message as a position at its own Milvus time (None: an empty channel)."""
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
        ts = message_time(got[0].payload, got[0].properties) or 0
        out[ch] = MsgPosition(ch, mid.serialize(), "", int(ts))
    return out


def snapshot_ts(positions: Mapping[str, MsgPosition | None]) -> int:
    """S: the newest Milvus time among the positions (0 when every channel is empty)."""
    return max((p.timestamp for p in positions.values() if p is not None), default=0)


def starting_positions(positions: Mapping[str, MsgPosition | None]) -> str:
    """The stream's ``startingPositions``: after each position (Milvus-style resume), earliest if empty."""
    return json.dumps({ch: (p.to_base64() if p is not None else "earliest") for ch, p in sorted(positions.items())})


# -- primary-key ranges -------------------------------------------------------------------------
@dataclass(frozen=True)
class PkRange:
    """``lo <= pk < hi``; None is open on that side. ``partition``: the one partition it is read from (its
    rows get ``partition_id`` as ``_partition``); None: the whole collection (``_partition`` null)."""

    lo: Any = None
    hi: Any = None
    partition: str | None = None
    partition_id: int | None = None

    @property
    def partition_names(self) -> list[str] | None:
        return [self.partition] if self.partition is not None else None

    def expr(self, pk: str, is_string: bool) -> str:
        def lit(v):
            return json.dumps(v) if is_string else str(int(v))

        if self.lo is None and self.hi is None:
            return f'{pk} >= ""' if is_string else f"{pk} < 0 or {pk} >= 0"
        if self.lo is None:
            return f"{pk} < {lit(self.hi)}"
        if self.hi is None:
            return f"{pk} >= {lit(self.lo)}"
        return f"{pk} >= {lit(self.lo)} and {pk} < {lit(self.hi)}"


def cut(rng: PkRange, keys: list, size: int) -> list[PkRange]:
    """``rng`` cut into pieces of at most ``size`` of the (sorted, distinct) ``keys`` each."""
    bounds = [keys[i] for i in range(size, len(keys), size)]
    edges = [rng.lo, *bounds, rng.hi]
    return [replace(rng, lo=a, hi=b) for a, b in zip(edges, edges[1:])]


def _pks(mc, info: CollectionInfo, collection: str, rng: PkRange) -> list:
    got = mc.query(collection, rng.expr(info.pk, info.pk_is_string), output_fields=[info.pk], limit=QUERY_CAP,
                   consistency_level="Strong", partition_names=rng.partition_names)
    return sorted({r[info.pk] for r in got})


def split(mc, info: CollectionInfo, collection: str, rng: PkRange, size: int) -> list[PkRange]:
    """Pieces of ``rng`` holding at most ``size`` rows each when asked (key-only queries)."""
    keys = _pks(mc, info, collection, rng)
    if len(keys) < QUERY_CAP:
        return cut(rng, keys, size)
    mid = keys[len(keys) // 2]
    return split(mc, info, collection, replace(rng, hi=mid), size) + split(mc, info, collection,
                                                                          replace(rng, lo=mid), size)


def plan_ranges(mc, info: CollectionInfo, collection: str, tasks: int,
                partitions: list[tuple[str, int]] | None = None) -> list[PkRange]:
    """About ``tasks`` ranges from one key-only query per partition (exact when it holds every key;
    otherwise a sample, and each task splits its range further). With ``partitions`` (name, id) every
    range reads one partition, so its rows carry the partition's id; every partition gets at least one
    range (a row written into an empty one before S must still be read)."""
    wholes = [PkRange(partition=n, partition_id=i) for n, i in partitions] if partitions else [PkRange()]
    keyed = [(w, _pks(mc, info, collection, w)) for w in wholes]
    size = max(1, -(-sum(len(k) for _, k in keyed) // max(1, tasks)))
    return [r for w, keys in keyed for r in (cut(w, keys, size) if keys else [w])]


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


# -- rows as Arrow --------------------------------------------------------------------------------
@dataclass
class RangeReader:
    """Reads ranges of one collection into record batches of ``schema`` (the table's columns): each row
    a change at S (``_ts`` = S, ``_seq`` = ``snapshot_seq(S)``: after every change at S)."""

    target: MilvusTarget
    info: CollectionInfo
    schema: pa.Schema
    snapshot_ts: int
    rows_per_query: int = 4096

    def read(self, ranges: list[PkRange], mc=None) -> Iterator[pa.RecordBatch]:
        own = mc is None
        mc = mc or self.target.client()
        try:
            for rng in ranges:
                for piece in split(mc, self.info, self.target.collection, rng, self.rows_per_query):
                    yield from self._read_piece(mc, piece)
        finally:
            if own:
                mc.close()

    def _read_piece(self, mc, rng: PkRange) -> Iterator[pa.RecordBatch]:
        rows = mc.query(self.target.collection, rng.expr(self.info.pk, self.info.pk_is_string), output_fields=["*"],
                        limit=QUERY_CAP, consistency_level="Strong", partition_names=rng.partition_names)
        if len(rows) >= QUERY_CAP:  # written to meanwhile: halve by keys and read again
            for piece in split(mc, self.info, self.target.collection, rng, self.rows_per_query):
                if piece == rng:
                    raise MirrorError(f"collection {self.target.collection!r}: range {rng} cannot be split below "
                                      f"{QUERY_CAP} rows")
                yield from self._read_piece(mc, piece)
            return
        if rows:
            yield to_batch(rows, self.schema, self.info, self.snapshot_ts, rng.partition_id)


def _column(values: list, typ: pa.DataType) -> pa.Array:
    if pa.types.is_string(typ) or pa.types.is_large_string(typ):
        values = [v if v is None or isinstance(v, str) else json.dumps(v, separators=(",", ":"), ensure_ascii=False)
                  for v in values]
    elif pa.types.is_binary(typ) or pa.types.is_large_binary(typ):
        values = [v[0] if isinstance(v, list) else v for v in values]  # pymilvus: a binary vector as [bytes]
    return pa.array(values, type=typ)


def to_batch(rows: list[dict], schema: pa.Schema, info: CollectionInfo, snapshot_ts: int,
             partition_id: int | None = None) -> pa.RecordBatch:
    """Query rows -> one record batch of ``schema``, column by column. Dynamic keys (flattened into the
    row by ``query``) go back under ``$meta`` as JSON text; ``_partition`` is the id of the partition
    the rows were queried from (null when read across partitions); columns absent from Milvus are null."""
    declared = set(info.fields)
    extra = {TS: pa.array(np.full(len(rows), snapshot_ts, dtype=np.int64)),
             SEQ: snapshot_seq_array(snapshot_ts, len(rows)),
             PARTITION: pa.array(np.full(len(rows), partition_id or 0, dtype=np.int64),
                                 mask=None if partition_id is not None else np.ones(len(rows), dtype=bool))}
    cols = []
    for f in schema:
        if f.name in extra:
            cols.append(extra[f.name].cast(f.type))
        elif f.name == META:
            cols.append(_column([{k: v for k, v in r.items() if k not in declared} for r in rows], f.type))
        else:
            cols.append(_column([r.get(f.name) for r in rows], f.type))
    return pa.RecordBatch.from_arrays(cols, schema=schema)
