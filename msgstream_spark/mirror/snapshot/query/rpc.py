"""Milvus's ``Query`` RPC as the snapshot sends it: our own requests on the project's proxy connection.

Spark-free. pymilvus's row conversion is skipped: the answer (``QueryResults``) is columnar already
(``repeated schema.FieldData``, decoded by msg/columns.py like an insert). Every call carries
``collection_id`` (``query_params``): Milvus's proxy (``internal/proxy/task_query.go``, ``PreExecute``)
refuses a query whose id is not the collection the name resolves to, so a collection dropped and
re-created, or an alias moved, fails the snapshot instead of mixing two collections. A pinned read adds
``iterator=true`` and ``guarantee_timestamp=S``: the proxy then sets the MVCC time to S (same
function); Milvus 2.3.5 has no such pin (each query reads at its own time >= S).

"At its own time >= S" is the ``guarantee_timestamp`` S itself (``QueryTarget.floor_ts``, consistency level
Customized): the proxy keeps a Customized request's timestamp (``parseGuaranteeTsFromConsistency`` changes only
Strong, Bounded and Eventually), the query node waits until its safe time reaches it and reads at that safe time
(``delegator``: ``MvccTimestamp = tSafe``). A Strong query would wait for the proxy's *current* time instead, up
to a time-tick interval (200 ms) per call on a busy server; Bounded (level 2, which this module sent as "Strong"
until issue #40) reads at whatever the node has, and missed rows written just before S on the real 2.3.5.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from msgstream_spark.errors import MirrorError, MsgStreamError
from msgstream_spark.mq.milvus.connection import ProxyConnection, pb_modules, rpc_error
from msgstream_spark.mq.milvus.settings import MilvusSettings

log = logging.getLogger(__name__)

STRONG, BOUNDED, CUSTOMIZED = 0, 2, 4  # common.ConsistencyLevel
_TOO_LARGE = ("exceed the maxoutputsize", "larger than max", "message larger", "resource_exhausted",
              "received message larger", "grpc message exceeds")
_CHANGED = "collection id is not consistent"


class AnswerTooLarge(MirrorError):
    """Milvus refused an answer as too large (``maxOutputSize``, or the gRPC message size limits)."""


class CollectionChanged(MirrorError):
    """The collection's name resolves to another collection id than the snapshot's."""


@dataclass(frozen=True)
class QueryTarget:
    """What every task needs to query the collection (plain data, picklable)."""

    settings: MilvusSettings
    collection: str
    collection_id: int
    pin_ts: int = 0  # > 0: read at exactly this time (iterator + guarantee_timestamp); 0: not pinned
    floor_ts: int = 0  # > 0: every call reads at a time >= this (guarantee_timestamp, Customized); 0: Strong

    def where(self) -> str:
        return f"collection {self.collection!r} (id {self.collection_id}) at Milvus {self.settings.address}"


class Querier:
    """One proxy connection sending the snapshot's queries (``close`` it)."""

    def __init__(self, target: QueryTarget) -> None:
        self.target = target
        self.conn = ProxyConnection(target.settings)
        _, self._pb, _ = pb_modules()
        self.calls = 0  # Query calls sent (the plan's cost in the job's summary)

    def request(self, expr: str, output_fields: list[str], partitions: list[str] | None = None,
                limit: int | None = None, pinned: bool = True, iterator: bool = False) -> Any:
        common_pb2 = pb_modules()[0]
        t = self.target
        floor = t.pin_ts if pinned and t.pin_ts else t.floor_ts
        req = self._pb.QueryRequest(db_name=t.settings.database, collection_name=t.collection, expr=expr,
                                    output_fields=output_fields, partition_names=partitions or [],
                                    consistency_level=CUSTOMIZED if floor else STRONG, use_default_consistency=False,
                                    guarantee_timestamp=floor)
        params = {"collection_id": str(t.collection_id)}
        if limit is not None:
            params["limit"] = str(limit)
        if (pinned and t.pin_ts) or iterator:
            params["iterator"] = "True"
        req.query_params.extend(common_pb2.KeyValuePair(key=k, value=v) for k, v in params.items())
        return req

    def call(self, req: Any, what: str) -> Any:
        """The ``QueryResults`` of ``req``; errors name the collection and ``what`` was asked."""
        import grpc

        stub = self.conn.stub()
        self.calls += 1
        try:
            resp = stub.Query(req, timeout=self.target.settings.request_timeout, metadata=self.conn.metadata())
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.RESOURCE_EXHAUSTED:
                raise AnswerTooLarge(f"{self.target.where()}: the answer to {what} is too large for gRPC: "
                                     f"{exc.details()}") from None
            raise _named(rpc_error(self.target.settings, f"Query ({what})", exc), self.target) from None
        st = resp.status
        if st.code or st.error_code:
            reason = st.reason or "no reason given"
            text = f"{self.target.where()}: {what} failed (Milvus status {st.code or st.error_code}): {reason}"
            if _CHANGED in reason.lower():
                raise CollectionChanged(f"{text}. The collection was dropped and re-created (or an alias moved) "
                                        "during the snapshot; start the mirror again into a new table")
            if any(s in reason.lower() for s in _TOO_LARGE):
                raise AnswerTooLarge(text)
            raise MirrorError(text)
        return resp

    def count(self, expr: str, partitions: list[str] | None = None) -> int:
        resp = self.call(self.request(expr, ["count(*)"], partitions, pinned=False), f"count(*) where {expr}")
        for fd in resp.fields_data:
            if fd.field_name == "count(*)" and len(fd.scalars.long_data.data):
                return int(fd.scalars.long_data.data[0])
        raise MirrorError(f"{self.target.where()}: count(*) where {expr} answered no count")

    def smallest_keys(self, expr: str, pk: str, partitions: list[str] | None, limit: int) -> list:
        """The ``limit`` smallest keys matching ``expr``, in key order. Milvus answers a ``limit`` query with the
        smallest matching keys (segcore's ``find_first`` walks each segment's key-ordered offsets, results
        merged by smallest key: seen on the real 2.3.5 across sealed and growing segments of two shards).
        Sorted here all the same: a plan built on them stays correct if a server answered other keys."""
        resp = self.call(self.request(expr, [pk], partitions, limit=limit, pinned=False),
                         f"the smallest {limit} keys where {expr}")
        fd = next((f for f in resp.fields_data if f.field_name == pk), None)
        if fd is None:
            return []
        data = fd.scalars.string_data.data if len(fd.scalars.string_data.data) else fd.scalars.long_data.data
        return sorted(data)

    def session_ts(self, expr: str) -> int:
        """The MVCC time an iterator's first page reports (``QueryResults.session_ts``; 0: not served). Sent
        Bounded, without a timestamp: the probe needs no fresh rows, only whether the server reports one."""
        req = self.request(expr, [], limit=1, pinned=False, iterator=True)
        req.consistency_level, req.guarantee_timestamp = BOUNDED, 0
        resp = self.call(req, "an iterator probe")
        return int(getattr(resp, "session_ts", 0) or 0)

    def close(self) -> None:
        self.conn.close()


def _named(err: MsgStreamError, target: QueryTarget) -> MsgStreamError:
    return type(err)(f"{target.where()}: {err}")
