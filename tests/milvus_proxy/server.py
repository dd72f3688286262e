"""The suite's own Milvus proxy: a gRPC ``MilvusService`` on a loopback port, over an embedded log.

Copies from Milvus 2.6 (``internal/proxy/impl.go``, ``internal/distributed/proxy/service.go``,
the streaming node's scanner; see wal.py for ``DumpMessages`` itself):

* ``Connect`` checks the ``dbname`` header (status 800 when the database does not exist) and
  returns a fresh TSO as ``identifier``;
* credentials arrive as pymilvus sends them (``authorization`` = base64 of a token or of
  ``user:password``); unary calls without valid ones fail with UNAUTHENTICATED. ``DumpMessages``
  is authenticated too, as in 2.6 builds with the external server's stream interceptor (#52387;
  earlier 2.6 builds did not authenticate it);
* ``DescribeCollection`` answers status 100 "collection not found" for an unknown collection, and
  the collection's ``physical_channel_names`` / ``virtual_channel_names`` otherwise;
* ``DumpMessages`` failures end the stream with gRPC UNKNOWN and Milvus's text; an unknown
  pchannel keeps the stream open and silent;
* ``ListDatabases`` and ``ShowCollections`` list what the test set (``databases``, ``collections``);
* ``Query`` and ``ShowPartitions`` over a model of the collection's rows kept by the test (see
  query.py), with Milvus's status codes and texts.

Simplified: collections, databases and credentials are set by the test (no RBAC; a schema only
where the test sets one in ``state.schemas`` or adds a model with ``add_model``); the WAL is an
embedded-log SQLite file whose ids are served as RocksMQ ids (base 36); every other RPC is
UNIMPLEMENTED. Fault injection: ``restart()`` (a real stop and start on the same port: open streams
break with UNAVAILABLE), ``stall_after`` (the next stream goes silent after N messages),
``unimplemented`` (an old proxy without ``DumpMessages``) and ``truncate()`` (retention removing
entries). Network timing: ``pause_after`` (the next stream pauses after those counts of messages
until ``release()``: which messages arrive in one burst; what is sent, and in which order, stays Milvus's).
"""

from __future__ import annotations

import base64
import threading
import time
from concurrent import futures
from dataclasses import dataclass, field

import grpc

from msgstream_spark.config import Config
from msgstream_spark.mq.local.client import LocalClient
from msgstream_spark.mq.milvus.connection import pb_modules
from tests.milvus_proxy.query import CollectionModel, QueryError, answer
from tests.milvus_proxy.wal import ROCKSMQ, InvalidRequest, b36, dump, tso_now

common_pb2, milvus_pb2, milvus_grpc = pb_modules()


@dataclass
class ProxyState:
    """What the test controls: collections, credentials and faults."""

    collections: dict = field(default_factory=dict)  # (db, name) -> (collection id, pchannels, vchannels)
    schemas: dict = field(default_factory=dict)  # (db, name) -> serialized CollectionSchema (else none sent)
    databases: set = field(default_factory=lambda: {"default"})
    tokens: set = field(default_factory=set)  # accepted raw tokens or "user:password"; empty: no auth
    unimplemented: bool = False
    stall_after: int | None = None
    # the next stream pauses after these counts of messages sent (network timing: what arrives in one burst),
    # each time until release() is called; the messages and their order stay Milvus's
    pause_after: tuple[int, ...] = ()
    releases: threading.Semaphore = field(default_factory=lambda: threading.Semaphore(0))
    write_ticks: bool = True  # each DumpMessages call persists a TimeTick first, as Milvus 2.6 does
    requests: list = field(default_factory=list)  # every DumpMessagesRequest, for assertions
    sent: int = 0
    # the one lock under which the test allocates a TSO, writes messages and changes a model, and under
    # which the proxy persists its TimeTicks and answers queries (so no write lands below a written tick)
    lock: threading.RLock = field(default_factory=threading.RLock)
    models: dict = field(default_factory=dict)  # (db, name) -> CollectionModel: what Query answers from
    queries: list = field(default_factory=list)  # (expr, output fields, model version seen) per Query answered
    queried: threading.Event = field(default_factory=threading.Event)  # set once a Query was answered
    on_query: object = None  # called with the request after each answered Query (before it is sent)
    max_output_bytes: int = 0  # > 0: answers above it fail as Milvus's maxOutputSize check does

    def release(self) -> None:
        """Let a stream paused by ``pause_after`` send its next burst."""
        self.releases.release()

    def vchannel_of(self, cid: int, pchannel: str) -> str | None:
        """Collection ``cid``'s vchannel on ``pchannel`` (Milvus's metadata, for version-0 DDL entries)."""
        for coll_id, pchannels, vchannels in self.collections.values():
            if coll_id == cid and pchannel in pchannels:
                return vchannels[pchannels.index(pchannel)]
        return None

    def add_model(self, db: str, name: str, cid: int, pchannels: list[str], vchannels: list[str],
                  schema, partitions: list[tuple[str, int]]) -> CollectionModel:
        """A collection the proxy describes (with ``schema``), lists the ``(name, id)`` partitions of and
        queries from a model of its rows."""
        self.collections[(db, name)] = (cid, list(pchannels), list(vchannels))
        self.schemas[(db, name)] = schema.SerializeToString()
        model = self.models[(db, name)] = CollectionModel(schema, self.lock, list(partitions), collection_id=cid)
        return model


class Servicer(milvus_grpc.MilvusServiceServicer):
    def __init__(self, store_path: str, state: ProxyState) -> None:
        self.state = state
        self.store = LocalClient(Config.from_dict({"mq": {"type": "local"}, "local": {"path": store_path}}))

    def _authenticated(self, context) -> bool:
        if not self.state.tokens:
            return True
        md = dict(context.invocation_metadata())
        try:
            secret = base64.b64decode(md.get("authorization", "")).decode()
        except ValueError:
            return False
        return secret in self.state.tokens

    def Connect(self, request, context):
        if not self._authenticated(context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "auth check failure, please check username and password")
        db = dict(context.invocation_metadata()).get("dbname") or "default"
        if db not in self.state.databases:
            return milvus_pb2.ConnectResponse(status=common_pb2.Status(
                code=800, error_code=common_pb2.UnexpectedError, reason=f"database not found[database={db}]"))
        return milvus_pb2.ConnectResponse(status=common_pb2.Status(), identifier=tso_now())

    def _check(self, request, context) -> tuple[str, common_pb2.Status | None]:
        """(database, None) for a known collection, else the "collection not found" status."""
        if not self._authenticated(context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "auth check failure, please check username and password")
        db = request.db_name or dict(context.invocation_metadata()).get("dbname") or "default"
        if (db, request.collection_name) in self.state.collections:
            return db, None
        name = request.collection_name
        return db, common_pb2.Status(code=100, error_code=common_pb2.CollectionNotExists,
                                     reason=f"collection not found[database={db}][collection={name}]")

    def DescribeCollection(self, request, context):
        db, missing = self._check(request, context)
        if missing is not None:
            return milvus_pb2.DescribeCollectionResponse(status=missing)
        cid, pchannels, vchannels = self.state.collections[(db, request.collection_name)]
        resp = milvus_pb2.DescribeCollectionResponse(
            status=common_pb2.Status(), collectionID=cid, collection_name=request.collection_name, db_name=db,
            physical_channel_names=list(pchannels), virtual_channel_names=list(vchannels),
            shards_num=len(vchannels))
        schema = self.state.schemas.get((db, request.collection_name))
        if schema is not None:
            resp.schema.ParseFromString(schema)
        return resp

    def ListDatabases(self, request, context):
        if not self._authenticated(context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "auth check failure, please check username and password")
        return milvus_pb2.ListDatabasesResponse(status=common_pb2.Status(), db_names=sorted(self.state.databases))

    def ShowCollections(self, request, context):
        """The database's collections (the ``dbname`` header, else ``db_name``; Milvus's default)."""
        if not self._authenticated(context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "auth check failure, please check username and password")
        db = dict(context.invocation_metadata()).get("dbname") or request.db_name or "default"
        got = sorted((name, cid) for (d, name), (cid, _, _) in self.state.collections.items() if d == db)
        return milvus_pb2.ShowCollectionsResponse(status=common_pb2.Status(), collection_names=[n for n, _ in got],
                                                  collection_ids=[i for _, i in got])

    def ShowPartitions(self, request, context):
        db, missing = self._check(request, context)
        if missing is not None:
            return milvus_pb2.ShowPartitionsResponse(status=missing)
        model = self.state.models.get((db, request.collection_name))
        parts = model.partitions if model is not None else []
        return milvus_pb2.ShowPartitionsResponse(status=common_pb2.Status(), partition_names=[n for n, _ in parts],
                                                 partitionIDs=[i for _, i in parts])

    def Query(self, request, context):
        db, missing = self._check(request, context)
        model = self.state.models.get((db, request.collection_name))
        if missing is None and model is None:
            missing = common_pb2.Status(code=101, error_code=common_pb2.UnexpectedError,
                                        reason=f"collection not loaded[collection={request.collection_name}]")
        if missing is not None:
            return milvus_pb2.QueryResults(status=missing)
        try:
            got = answer(model, request, self.state.max_output_bytes)
        except QueryError as exc:
            return milvus_pb2.QueryResults(status=common_pb2.Status(
                code=exc.code, error_code=common_pb2.UnexpectedError, reason=str(exc)))
        self.state.queries.append((request.expr, list(request.output_fields), got.version))
        self.state.queried.set()
        if callable(self.state.on_query):
            self.state.on_query(request)
        return milvus_pb2.QueryResults(status=common_pb2.Status(), fields_data=got.columns, output_fields=got.names,
                                       collection_name=request.collection_name, session_ts=got.session_ts)

    def DumpMessages(self, request, context):
        self.state.requests.append(request)
        if self.state.unimplemented:
            context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")
        if not self._authenticated(context):
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "auth check failure, please check username and password")
        sid = request.start_message_id.id if request.HasField("start_message_id") else None
        sent = 0
        pauses, self.state.pause_after = set(self.state.pause_after), ()
        try:
            for mid, payload, props in dump(self.store, request.pchannel, sid, request.start_message_id.WAL_name,
                                            request.include_start_message, request.start_timetick,
                                            request.end_timetick, context.is_active,
                                            write_ticks=self.state.write_ticks, lock=self.state.lock,
                                            vchannel_of=self.state.vchannel_of):
                if self.state.stall_after is not None and sent >= self.state.stall_after:
                    self.state.stall_after = None  # one stream stalls; the next one is served
                    while context.is_active():  # a stalled proxy: the stream stays open, silent
                        time.sleep(0.02)
                    return
                if sent in pauses:  # a burst ended: the next one waits for the test (or a cancel)
                    while not self.state.releases.acquire(timeout=0.02):
                        if not context.is_active():
                            return
                sent += 1
                self.state.sent += 1
                yield milvus_pb2.DumpMessagesResponse(message=common_pb2.ImmutableMessage(
                    id=common_pb2.MessageID(id=b36(mid), WAL_name=ROCKSMQ), payload=payload, properties=props))
        except InvalidRequest as exc:
            context.abort(grpc.StatusCode.UNKNOWN, str(exc))


class MilvusProxy:
    """Start, stop, restart the server on one loopback port; ``address`` is ``127.0.0.1:<port>``."""

    def __init__(self, store_path: str, state: ProxyState | None = None) -> None:
        self.store_path = store_path
        self.state = state or ProxyState()
        self.port = 0
        self._server: grpc.Server | None = None
        self._lock = threading.Lock()

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self.port}"

    def start(self) -> MilvusProxy:
        with self._lock:
            # Milvus's own keepalive enforcement (MinTime 5 s, pings without calls permitted): pymilvus pings an
            # idle connection every 10 s, which grpc's default server policy answers with GOAWAY "too many pings"
            server = grpc.server(futures.ThreadPoolExecutor(max_workers=16), options=[
                ("grpc.http2.min_ping_interval_without_data_ms", 5000),
                ("grpc.keepalive_permit_without_calls", 1)])
            milvus_grpc.add_MilvusServiceServicer_to_server(Servicer(self.store_path, self.state), server)
            port = server.add_insecure_port(f"127.0.0.1:{self.port}")
            if port == 0:
                raise RuntimeError(f"the test Milvus proxy could not bind 127.0.0.1:{self.port}")
            self.port = port
            server.start()
            self._server = server
        return self

    def stop(self, grace: float = 0.0) -> None:
        with self._lock:
            if self._server is not None:
                self._server.stop(grace).wait(10)
                self._server = None

    def restart(self) -> None:
        """A proxy restart: open streams break (UNAVAILABLE), then the same port serves again."""
        self.stop()
        self.start()

    def truncate(self, pchannel: str, upto_id: int) -> None:
        """Retention: remove the entries of ``pchannel`` up to and including ``upto_id``."""
        store = LocalClient(Config.from_dict({"mq": {"type": "local"}, "local": {"path": self.store_path}}))
        try:
            with store._db.lock:
                conn = store._db.get()
                conn.execute("BEGIN IMMEDIATE")
                conn.execute("DELETE FROM messages WHERE channel = ? AND id <= ?", (pchannel, upto_id))
                conn.execute("UPDATE channels SET removed_upto = MAX(removed_upto, ?) WHERE name = ?",
                             (upto_id, pchannel))
                conn.execute("COMMIT")
        finally:
            store.close()
