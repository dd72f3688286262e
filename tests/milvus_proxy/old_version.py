"""Pre-upgrade 2.5 entries as a Milvus 2.6 proxy serves them: version-0 messages.

Follows ../shared/docs/milvus-dumpmessages.md ("Pre-upgrade 2.5 entries") and Milvus's streaming node
(``internal/streamingnode/server/wal/adaptor/old_version_message.go`` ``newOldVersionImmutableMessage``,
its scanner's sliding ``_lc`` window, Milvus #48389/#48390). An entry without ``_v`` keeps its 2.5 body
(the payload); its properties are rebuilt, the 2.5 ``msg_type`` is not kept:

* ``_v`` = ``"0"``; ``_t`` = the 2.6 type of the body's type (TimeTick 1, Insert 2, Delete 3,
  CreateCollection 5, DropCollection 6, CreatePartition 7, DropPartition 8, Import 11);
* ``_tt`` = the body's BeginTs (the smallest row timestamp, else ``base.timestamp``), so several
  entries can share one ``_tt``;
* ``_vc`` = an Insert's or Delete's ShardName; a CreateCollection's vchannel of this pchannel; for
  DropCollection, Create/DropPartition and Import the collection's vchannel on this pchannel from
  the cluster's metadata (``vchannel_of``: the collections the test registered); none for a TimeTick
  (every vchannel). An entry whose vchannel is not known is skipped, as Milvus does;
* ``_h`` = the 2.6 header Milvus builds from the body (collection, partitions, an insert's segment);
* ``_lc`` = the id of the version-0 message 30 version-0 messages back in this scan (the scan's first
  one until 30 were read): a resume from it re-reads at most 30 of them.

The body's type comes from its ``msg_type`` property, else its ``MsgBase`` (Milvus's
``GetMsgTypeFromRaw``). Simplified: a payload that is no 2.5 message (the conformance suite's opaque
payloads; Milvus's streaming node would panic on it) is not converted: :func:`rebuild` returns None.
"""

from __future__ import annotations

import collections
from collections.abc import Callable

from google.protobuf.message import DecodeError as PbDecodeError

from msgstream_spark.msg.pb import common_pb2, msg_pb2
from tests.wal26 import producer as P

WINDOW = 30  # Milvus's default window for version-0 last-confirmed ids (#48390)
TIME_TICK = "1"
_MT = common_pb2.MsgType
# 2.5 msg_type -> (2.6 message type, the request class of the body)
_TYPES = {
    _MT.TimeTick: (1, msg_pb2.TimeTickMsg), _MT.Insert: (2, msg_pb2.InsertRequest),
    _MT.Delete: (3, msg_pb2.DeleteRequest), _MT.CreateCollection: (5, msg_pb2.CreateCollectionRequest),
    _MT.DropCollection: (6, msg_pb2.DropCollectionRequest), _MT.CreatePartition: (7, msg_pb2.CreatePartitionRequest),
    _MT.DropPartition: (8, msg_pb2.DropPartitionRequest),
}
if hasattr(msg_pb2, "ImportMsg"):
    _TYPES[_MT.Import] = (11, msg_pb2.ImportMsg)


def _body(payload: bytes, props: dict):
    """(2.6 type, parsed 2.5 body) of an entry, or None when it is no 2.5 message."""
    name = props.get("msg_type")
    t = _MT.Value(name) if name in _MT.keys() else None
    if t is None:
        try:
            t = common_pb2.MsgHeader.FromString(payload).base.msg_type
        except PbDecodeError:
            return None
    if t not in _TYPES:
        return None
    new_type, cls = _TYPES[t]
    try:
        return new_type, cls.FromString(payload)
    except PbDecodeError:
        return None


def _begin_ts(body) -> int:
    stamps = list(getattr(body, "timestamps", ()))
    return min(stamps) if stamps else body.base.timestamp


def _vchannel_and_header(new_type: int, body, pchannel: str, payload_size: int,
                         vchannel_of: Callable[[int, str], str | None]) -> tuple[str | None, bytes] | None:
    """``_vc`` and ``_h`` Milvus builds for a body of 2.6 type ``new_type`` (None: vchannel unknown, skipped)."""
    if new_type == 1:
        return None, b""
    cid = body.collectionID
    if new_type == 2:
        header = P.insert_header(cid, [(body.partitionID, body.num_rows, payload_size, body.segmentID)])
        return body.shardName, header
    if new_type == 3:
        return body.shardName, P.vfield(1, cid)
    if new_type == 5:
        names = list(body.physicalChannelNames)
        if pchannel not in names:
            return None
        return body.virtualChannelNames[names.index(pchannel)], P.vfield(1, cid) + P.packed(2, body.partitionIDs)
    vc = vchannel_of(cid, pchannel)
    if vc is None:
        return None
    if new_type in (7, 8):
        return vc, P.vfield(1, cid) + P.vfield(2, body.partitionID)
    return vc, P.vfield(1, cid) if new_type == 6 else b""


class OldVersion:
    """One scan's conversion of 2.5 entries (its ``_lc`` window is the scan's own)."""

    def __init__(self, pchannel: str, vchannel_of: Callable[[int, str], str | None]) -> None:
        self.pchannel = pchannel
        self.vchannel_of = vchannel_of
        self._window: collections.deque[int] = collections.deque(maxlen=WINDOW + 1)

    def rebuild(self, offset: int, payload: bytes, props: dict) -> tuple[int, dict] | None:
        """``(_tt, properties)`` of the version-0 message an entry without ``_v`` becomes; None when the entry is
        no 2.5 message (passed on unchanged) or Milvus skips it (``{}`` properties and ``_tt`` -1)."""
        got = _body(payload, props)
        if got is None:
            return None
        new_type, body = got
        vh = _vchannel_and_header(new_type, body, self.pchannel, len(payload), self.vchannel_of)
        if vh is None:
            return -1, {}
        self._window.append(offset)
        tt = _begin_ts(body)
        return tt, P.props(new_type, tt, vc=vh[0], header=vh[1], version=0, wt=None, lc=P.b36(self._window[0]))
