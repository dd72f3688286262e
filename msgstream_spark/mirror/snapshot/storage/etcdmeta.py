"""DataCoord's segment metadata and channel checkpoints, read from etcd at one revision.

Keys under ``{etcd.rootPath}/meta/datacoord-meta/`` (``internal/metastore/kv/datacoord/constant.go`` and
``kv_catalog.go`` of milvus-io/milvus): ``s/{collection}/{partition}/{segment}`` = ``datapb.SegmentInfo``
with its binlog lists moved out to ``binlog|deltalog|statslog/{collection}/{partition}/{segment}/{field}``
= ``datapb.FieldBinlog``; ``channel-cp/{vchannel}`` = ``msgpb.MsgPosition``. Milvus 2.3.5 stores each
``Binlog`` with its ``logID`` (field 6) and no ``log_path``: the path is rebuilt from the ids
(``insert_log/{coll}/{part}/{seg}/{field}/{logID}``, ``delta_log/{coll}/{part}/{seg}/{logID}``).

etcd is read through its v3 JSON gateway (``POST /v3/kv/range`` with base64 keys, on the client port), with
urllib: no client library. The first range answers the store's revision; every later range asks for that
revision, so all keys come from one consistent state. ``datapb`` is not in pymilvus's protobufs: the few
fields used are decoded from the protobuf wire format here (field numbers from ``data_coord.proto``).
"""

from __future__ import annotations

import base64
import json
import urllib.error
import urllib.request
from dataclasses import dataclass, field

from msgstream_spark.errors import MirrorError
from msgstream_spark.msg.position import MsgPosition

# common.SegmentState (common.proto)
GROWING, SEALED, FLUSHED, FLUSHING, DROPPED = 2, 3, 4, 5, 6
LEVEL_L0 = 1  # datapb.SegmentLevel: Legacy 0, L0 1, L1 2, L2 3


# -- protobuf wire format ---------------------------------------------------------------------
def _varint(buf: bytes, i: int) -> tuple[int, int]:
    out = shift = 0
    while True:
        b = buf[i]
        i += 1
        out |= (b & 0x7F) << shift
        if b < 0x80:
            return out, i
        shift += 7


def fields(buf: bytes) -> dict[int, list]:
    """{field number: [values]}: varints as int, length-delimited as bytes, fixed ones as raw bytes."""
    out: dict[int, list] = {}
    i = 0
    while i < len(buf):
        key, i = _varint(buf, i)
        num, wire = key >> 3, key & 7
        if wire == 0:
            v, i = _varint(buf, i)
        elif wire == 2:
            n, i = _varint(buf, i)
            v, i = bytes(buf[i:i + n]), i + n
        elif wire in (1, 5):
            n = 8 if wire == 1 else 4
            v, i = bytes(buf[i:i + n]), i + n
        else:
            raise MirrorError(f"etcd metadata: protobuf wire type {wire} of field {num} is not decodable")
        out.setdefault(num, []).append(v)
    return out


def _one(f: dict[int, list], num: int, default=0):
    return f[num][-1] if num in f else default


def _signed(v: int) -> int:
    return v - (1 << 64) if v >= 1 << 63 else v


@dataclass(frozen=True)
class LogFile:
    log_id: int
    entries: int
    ts_from: int
    ts_to: int
    path: str = ""  # log_path (field 4), set by Milvus before 2.3.x; else rebuilt from the ids
    size: int = 0  # log_size (field 5): the file's bytes (0 where the writer left it out)


def field_binlog(buf: bytes) -> tuple[int, list[LogFile]]:
    """``datapb.FieldBinlog``: (fieldID 1, binlogs 2 = Binlog{entries_num 1, timestamp_from 2, timestamp_to 3,
    log_path 4, log_size 5, logID 6})."""
    f = fields(buf)
    logs = []
    for b in f.get(2, []):
        g = fields(b)
        path = _one(g, 4, b"").decode()
        logs.append(LogFile(_signed(_one(g, 6)), _signed(_one(g, 1)), _one(g, 2), _one(g, 3), path,
                            _signed(_one(g, 5))))
    return _signed(_one(f, 1)), logs


@dataclass
class Segment:
    id: int
    collection_id: int
    partition_id: int
    channel: str
    rows: int
    state: int
    level: int = 0
    storage_version: int = 0
    compacted: bool = False
    dml_ts: int = 0
    binlogs: dict[int, list[LogFile]] = field(default_factory=dict)  # field id -> files
    deltalogs: list[LogFile] = field(default_factory=list)
    statslogs: dict[int, list[LogFile]] = field(default_factory=dict)


def segment_info(buf: bytes) -> Segment:
    """``datapb.SegmentInfo``: ID 1, collectionID 2, partitionID 3, insert_channel 4, num_of_rows 5, state 6,
    dml_position 10, compacted 19, level 20, storage_version 21 (binlogs 11-13 when stored inline)."""
    f = fields(buf)
    dml = fields(_one(f, 10, b""))
    seg = Segment(_signed(_one(f, 1)), _signed(_one(f, 2)), _signed(_one(f, 3)), _one(f, 4, b"").decode(),
                  _signed(_one(f, 5)), _one(f, 6), _one(f, 20), _signed(_one(f, 21)), bool(_one(f, 19)),
                  _one(dml, 4))
    for num, into in ((11, seg.binlogs), (12, seg.statslogs)):
        for b in f.get(num, []):
            fid, logs = field_binlog(b)
            into.setdefault(fid, []).extend(logs)
    for b in f.get(13, []):
        seg.deltalogs.extend(field_binlog(b)[1])
    return seg


# -- the JSON gateway -----------------------------------------------------------------------------
def _b64(b: bytes) -> str:
    return base64.b64encode(b).decode("ascii")


def prefix_end(prefix: bytes) -> bytes:
    """The range end covering every key that starts with ``prefix``."""
    p = bytearray(prefix)
    while p and p[-1] == 0xFF:
        p.pop()
    if not p:
        return b"\0"
    p[-1] += 1
    return bytes(p)


@dataclass
class EtcdGateway:
    """etcd's v3 JSON gateway at ``endpoint`` (host:port or URL); ``revision`` pins every read once set."""

    endpoint: str
    timeout: float = 30.0
    revision: int | None = None

    @property
    def url(self) -> str:
        e = self.endpoint.strip().rstrip("/")
        return e if "://" in e else f"http://{e}"

    def range(self, prefix: str) -> dict[str, bytes]:
        key = prefix.encode()
        body: dict = {"key": _b64(key), "range_end": _b64(prefix_end(key))}
        if self.revision is not None:
            body["revision"] = str(self.revision)
        req = urllib.request.Request(f"{self.url}/v3/kv/range", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:
                got = json.loads(resp.read())
        except (urllib.error.URLError, OSError, ValueError) as exc:
            raise MirrorError(f"cannot read etcd at {self.url} (config key etcd.endpoints), prefix {prefix!r}: "
                              f"{exc}") from exc
        if "error" in got or "message" in got and "kvs" not in got:
            raise MirrorError(f"etcd at {self.url} refused the range {prefix!r} at revision {self.revision}: "
                              f"{got.get('message') or got.get('error')} (compacted past it? read again)")
        if self.revision is None:
            self.revision = int(got.get("header", {}).get("revision", 0))
        return {base64.b64decode(kv["key"]).decode(): base64.b64decode(kv.get("value", ""))
                for kv in got.get("kvs", [])}


@dataclass
class CollectionMeta:
    """The collection's segments and checkpoints as of one etcd revision."""

    revision: int
    segments: list[Segment]
    checkpoints: dict[str, MsgPosition]  # vchannel -> the data node's recovery position


def _attach(seg_by_key: dict[tuple[int, int, int], Segment], kvs: dict[str, bytes], kind: str) -> None:
    for key, value in kvs.items():
        parts = key.rsplit("/", 4)
        seg = seg_by_key.get((int(parts[1]), int(parts[2]), int(parts[3])))
        if seg is None or not value:
            continue
        fid, logs = field_binlog(value)
        if kind == "binlog":
            seg.binlogs.setdefault(int(parts[4]), []).extend(logs)
        elif kind == "statslog":
            seg.statslogs.setdefault(int(parts[4]), []).extend(logs)
        else:
            seg.deltalogs.extend(logs)


def read_collection(gw: EtcdGateway, root: str, collection_id: int) -> CollectionMeta:
    """Every segment of ``collection_id`` with its logs, and every vchannel checkpoint of it, at one revision."""
    base = f"{root.strip('/')}/meta/datacoord-meta"
    segs = [segment_info(v) for v in gw.range(f"{base}/s/{collection_id}/").values()]
    by_key = {(s.collection_id, s.partition_id, s.id): s for s in segs}
    for kind in ("binlog", "deltalog", "statslog"):
        _attach(by_key, gw.range(f"{base}/{kind}/{collection_id}/"), kind)
    cps = {}
    for key, value in gw.range(f"{base}/channel-cp/").items():
        ch = key.rsplit("/", 1)[1]
        if f"_{collection_id}v" in ch:
            cps[ch] = MsgPosition.from_proto_bytes(value)
    return CollectionMeta(int(gw.revision or 0), segs, cps)
