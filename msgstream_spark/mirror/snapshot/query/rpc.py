"""Milvus's ``Query`` RPC as the snapshot sends it: our own requests on the project's proxy connection.

Spark-free. pymilvus's row conversion is skipped: the answer (``QueryResults``) is columnar already
(``repeated schema.FieldData``, decoded by msg/columns.py like an insert). Every call carries
``collection_id`` (``query_params``): Milvus's proxy (``internal/proxy/task_query.go``, ``PreExecute``)
refuses a query whose id is not the collection the name resolves to, so a collection dropped and
re-created, or an alias moved, fails the snapshot instead of mixing two collections. A pinned read adds
``iterator=true`` and ``guarantee_timestamp=S``: the proxy then sets the MVCC time to S (same
function); Milvus 2.3.5 has no such pin (each query reads at its own time >= S, Strong consistency).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from msgstream_spark.errors import MirrorError, MsgStreamError
from msgstream_spark.mq.milvus.connection import ProxyConnection, pb_modules, rpc_error
from msgstream_spark.mq.milvus.settings import MilvusSettings

log = logging.getLogger(__name__)

STRONG = 2  # common.ConsistencyLevel.Strong
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
    pin_ts: int = 0  # > 0: read at exactly this time (iterator + guarantee_timestamp); 0: Strong

    def where(self) -> str:
        return f"collection {self.collection!r} (id {self.collection_id}) at Milvus {self.settings.address}"


class Querier:
    """One proxy connection sending the snapshot's queries (``close`` it)."""

    def __init__(self, target: QueryTarget) -> None:
        self.target = target
        self.conn = ProxyConnection(target.settings)
        _, self._pb, _ = pb_modules()

    def request(self, expr: str, output_fields: list[str], partitions: list[str] | None = None,
                limit: int | None = None, pinned: bool = True, iterator: bool = False) -> Any:
        common_pb2 = pb_modules()[0]
        t = self.target
        req = self._pb.QueryRequest(db_name=t.settings.database, collection_name=t.collection, expr=expr,
                                    output_fields=output_fields, partition_names=partitions or [],
                                    consistency_level=STRONG, use_default_consistency=False)
        params = {"collection_id": str(t.collection_id)}
        if limit is not None:
            params["limit"] = str(limit)
        if (pinned and t.pin_ts) or iterator:
            params["iterator"] = "True"
        if pinned and t.pin_ts:
            req.guarantee_timestamp = t.pin_ts
        req.query_params.extend(common_pb2.KeyValuePair(key=k, value=v) for k, v in params.items())
        return req

    def call(self, req: Any, what: str) -> Any:
        """The ``QueryResults`` of ``req``; errors name the collection and ``what`` was asked."""
        import grpc

        stub = self.conn.stub()
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

    def session_ts(self, expr: str) -> int:
        """The MVCC time an iterator's first page reports (``QueryResults.session_ts``; 0: not served)."""
        resp = self.call(self.request(expr, [], limit=1, pinned=False, iterator=True), "an iterator probe")
        return int(getattr(resp, "session_ts", 0) or 0)

    def close(self) -> None:
        self.conn.close()


def _named(err: MsgStreamError, target: QueryTarget) -> MsgStreamError:
    return type(err)(f"{target.where()}: {err}")
