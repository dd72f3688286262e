"""PulsarTestBroker: an asyncio server on 127.0.0.1 speaking Pulsar's binary protocol, in memory.

It runs its own event loop in a background thread (``start``/``stop`` or a ``with`` block) and
serves, besides the binary protocol, the one admin REST call the backend uses to list topics
(``GET /admin/v2/persistent/<tenant>/<namespace>``). Like a broker with deduplication on, a
producer that reconnects and resends is not stored twice. Fault hooks for tests:
``drop_connections()`` closes every client connection abruptly.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import logging
import struct
import subprocess
import sys
import threading
from pathlib import Path

from tests.pulsar_broker import protocol as p
from tests.pulsar_broker.state import ConsumerState, Entry, Subscription, Topic

log = logging.getLogger(__name__)

MAX_FRAME = 8 * 1024 * 1024


class _Conn:
    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self.writer = writer
        self.producers: dict[int, tuple[Topic, str]] = {}
        self.consumers: dict[int, ConsumerState] = {}
        self.connected = False

    def send(self, frame: bytes) -> None:
        if not self.writer.is_closing():
            self.writer.write(frame)

    def reply(self, cmd_type: int, **fields) -> None:
        self.send(p.encode_frame(p.command(cmd_type, **fields)))


class BrokerProcess:
    """The test broker in a child process (``python -m tests.pulsar_broker``); ``url`` once started."""

    def __init__(self) -> None:
        self.proc: subprocess.Popen | None = None
        self.port = self.web_port = 0

    @property
    def url(self) -> str:
        return f"pulsar://127.0.0.1:{self.port}"

    def __enter__(self) -> BrokerProcess:
        root = Path(__file__).resolve().parents[2]
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.pulsar_broker"], cwd=root, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        line = self.proc.stdout.readline() if self.proc.stdout else ""  # the child prints READY or exits
        if not line.startswith("READY"):
            self.__exit__()
            raise RuntimeError(f"the test broker process did not start: {line!r}")
        self.port, self.web_port = (int(x) for x in line.split()[1:3])
        return self

    def __exit__(self, *exc: object) -> None:
        if self.proc is not None:
            if self.proc.stdin:
                self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
            self.proc = None


class PulsarTestBroker:
    """An in-memory Pulsar broker for tests. ``url`` is ``pulsar://127.0.0.1:<port>``."""

    def __init__(self, *, token: str | None = None, max_message_size: int = 5 * 1024 * 1024) -> None:
        self.token = token
        self.max_message_size = max_message_size
        self.topics: dict[str, Topic] = {}
        self.port = 0
        self.web_port = 0
        self.frames_received = 0
        self._conns: set[_Conn] = set()
        self._names = itertools.count()
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._servers: list[asyncio.base_events.Server] = []

    # -- lifecycle ----------------------------------------------------------------------------------
    @property
    def url(self) -> str:
        return f"pulsar://127.0.0.1:{self.port}"

    @property
    def web_url(self) -> str:
        return f"http://127.0.0.1:{self.web_port}"

    def start(self, port: int = 0, web_port: int = 0) -> PulsarTestBroker:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="pulsar-test-broker", daemon=True)
        self._thread.start()
        self.call(self._listen(port, web_port))
        return self

    async def _listen(self, port: int, web_port: int) -> None:
        srv = await asyncio.start_server(self._serve, "127.0.0.1", port)
        web = await asyncio.start_server(self._serve_http, "127.0.0.1", web_port)
        self._servers = [srv, web]
        self.port = srv.sockets[0].getsockname()[1]
        self.web_port = web.sockets[0].getsockname()[1]

    def stop(self) -> None:
        if self._loop is None:
            return
        try:
            self.call(self._shutdown())
        finally:
            self._loop.call_soon_threadsafe(self._loop.stop)
            if self._thread is not None:
                self._thread.join(10)
            self._loop.close()
            self._loop = None

    async def _shutdown(self) -> None:
        for s in self._servers:
            s.close()
        await self._drop()
        for s in self._servers:
            await s.wait_closed()

    def __enter__(self) -> PulsarTestBroker:
        return self if self._loop is not None else self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def call(self, coro, timeout: float = 30.0):
        """Run a coroutine on the broker's loop from another thread and return its result."""
        assert self._loop is not None, "broker not started"
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout)

    # -- fault hooks and inspection (thread-safe) --------------------------------------------------
    def drop_connections(self) -> int:
        """Close every client connection abruptly; returns how many were closed."""
        return self.call(self._drop())

    async def _drop(self) -> int:
        conns = list(self._conns)
        for c in conns:
            c.writer.transport.abort()
        return len(conns)

    def connection_count(self) -> int:
        return self.call(self._count())

    async def _count(self) -> int:
        return len(self._conns)

    def entry_count(self, topic: str) -> int:
        async def count() -> int:
            t = self.topics.get(topic)
            return len(t.entries) if t else 0
        return self.call(count())

    def mark_delete(self, topic: str, subscription: str) -> int | None:
        """The entry up to which ``subscription`` has acknowledged everything (-1: nothing), None if absent."""
        async def get() -> int | None:
            t = self.topics.get(topic)
            sub = t.subscriptions.get(subscription) if t else None
            return sub.mark_delete if sub else None
        return self.call(get())

    def subscription_names(self, topic: str) -> list[str]:
        async def names() -> list[str]:
            t = self.topics.get(topic)
            return sorted(t.subscriptions) if t else []
        return self.call(names())

    # -- the binary protocol -------------------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        conn = _Conn(writer)
        self._conns.add(conn)
        try:
            while True:
                (size,) = struct.unpack(">I", await reader.readexactly(4))
                if size > MAX_FRAME:
                    raise p.ProtocolError(f"frame of {size} bytes exceeds {MAX_FRAME}")
                frame = await reader.readexactly(size)
                self.frames_received += 1
                cmd, data, crc_ok = p.decode_frame(frame)
                if not conn.connected and cmd.type != p.CONNECT:
                    raise p.ProtocolError(f"command {cmd.type} before CONNECT")
                if not self._handle(conn, cmd, data, crc_ok):
                    break
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        except p.ProtocolError as exc:
            log.warning("test broker: closing a connection: %s", exc)
        finally:
            self._lost(conn)
            writer.close()

    def _lost(self, conn: _Conn) -> None:
        self._conns.discard(conn)
        for cs in list(conn.consumers.values()):
            self._remove_consumer(cs)
        conn.consumers.clear()
        conn.producers.clear()

    def _topic(self, name: str) -> Topic:
        t = self.topics.get(name)
        if t is None:
            t = self.topics[name] = Topic(name)
        return t

    def _handle(self, conn: _Conn, cmd, data: bytes | None, crc_ok: bool) -> bool:
        """Handle one command; False closes the connection."""
        t = cmd.type
        if t == p.CONNECT:
            return self._on_connect(conn, cmd.connect)
        if t == p.PING:
            conn.reply(p.PONG)
        elif t == p.PONG:
            pass
        elif t == p.PARTITIONED_METADATA:
            conn.reply(p.PARTITIONED_METADATA_RESPONSE, request_id=cmd.partitionMetadata.request_id,
                       partitions=0, response=p.METADATA_SUCCESS)
        elif t == p.LOOKUP:
            conn.reply(p.LOOKUP_RESPONSE, request_id=cmd.lookupTopic.request_id, brokerServiceUrl=self.url,
                       response=p.LOOKUP_CONNECT, authoritative=True)
        elif t == p.PRODUCER:
            c = cmd.producer
            topic = self._topic(c.topic)
            name = c.producer_name or f"test-broker-{next(self._names)}"
            conn.producers[c.producer_id] = (topic, name)
            conn.reply(p.PRODUCER_SUCCESS, request_id=c.request_id, producer_name=name,
                       last_sequence_id=topic.last_sequence.get(name, -1))
        elif t == p.SEND:
            self._on_send(conn, cmd.send, data, crc_ok)
        elif t == p.SUBSCRIBE:
            self._on_subscribe(conn, cmd.subscribe)
        elif t == p.FLOW:
            cs = conn.consumers.get(cmd.flow.consumer_id)
            if cs is not None:
                cs.permits += cmd.flow.messagePermits
                cs.sub.dispatch()
        elif t == p.ACK:
            self._on_ack(conn, cmd.ack)
        elif t == p.REDELIVER_UNACKNOWLEDGED_MESSAGES:
            c = cmd.redeliverUnacknowledgedMessages
            cs = conn.consumers.get(c.consumer_id)
            if cs is not None:
                ids = {cs.sub.topic.index_of(m) for m in c.message_ids} if c.message_ids else set(cs.pending)
                cs.pending -= ids
                cs.sub.redeliver |= {i for i in ids if not cs.sub.done(i)}
                cs.sub.dispatch()
        elif t == p.SEEK:
            self._on_seek(conn, cmd.seek)
        elif t == p.GET_LAST_MESSAGE_ID:
            c = cmd.getLastMessageId
            cs = conn.consumers.get(c.consumer_id)
            if cs is None:
                conn.reply(p.ERROR, request_id=c.request_id, error=p.CONSUMER_NOT_FOUND,
                           message=f"consumer {c.consumer_id} not found")
            else:
                conn.reply(p.GET_LAST_MESSAGE_ID_RESPONSE, request_id=c.request_id,
                           last_message_id=cs.sub.topic.last_message_id(),
                           consumer_mark_delete_position=p.message_id(cs.sub.topic.ledger, cs.sub.mark_delete, -1, -1))
        elif t == p.UNSUBSCRIBE:
            c = cmd.unsubscribe
            cs = conn.consumers.pop(c.consumer_id, None)
            if cs is None:
                conn.reply(p.ERROR, request_id=c.request_id, error=p.CONSUMER_NOT_FOUND,
                           message=f"consumer {c.consumer_id} not found")
            elif len(cs.sub.consumers) > 1:
                conn.consumers[c.consumer_id] = cs
                conn.reply(p.ERROR, request_id=c.request_id, error=p.CONSUMER_BUSY,
                           message=f"subscription {cs.sub.name} has other consumers")
            else:
                cs.sub.detach(cs)
                cs.sub.topic.subscriptions.pop(cs.sub.name, None)
                conn.reply(p.SUCCESS, request_id=c.request_id)
        elif t == p.CLOSE_PRODUCER:
            conn.producers.pop(cmd.close_producer.producer_id, None)
            conn.reply(p.SUCCESS, request_id=cmd.close_producer.request_id)
        elif t == p.CLOSE_CONSUMER:
            cs = conn.consumers.pop(cmd.close_consumer.consumer_id, None)
            if cs is not None:
                self._remove_consumer(cs)
            conn.reply(p.SUCCESS, request_id=cmd.close_consumer.request_id)
        elif t == p.GET_TOPICS_OF_NAMESPACE:
            c = cmd.getTopicsOfNamespace
            prefix = f"persistent://{c.namespace}/"
            conn.reply(p.GET_TOPICS_OF_NAMESPACE_RESPONSE, request_id=c.request_id,
                       topics=sorted(n for n in self.topics if n.startswith(prefix)))
        else:
            log.warning("test broker: ignoring unsupported command type %d", t)
        return True

    def _on_connect(self, conn: _Conn, c) -> bool:
        if self.token is not None and (c.auth_method_name != "token" or c.auth_data != self.token.encode()):
            conn.reply(p.ERROR, request_id=p.U64_MAX, error=p.AUTHENTICATION_ERROR,
                       message="authentication failed: a valid token is required")
            return False
        conn.connected = True
        conn.reply(p.CONNECTED, server_version="msgstream-test-broker",
                   protocol_version=min(c.protocol_version, 21), max_message_size=self.max_message_size)
        return True

    def _on_send(self, conn: _Conn, c, data: bytes | None, crc_ok: bool) -> None:
        pid, seq = c.producer_id, c.sequence_id
        prod = conn.producers.get(pid)
        if prod is None or data is None or not crc_ok:
            why = (f"producer {pid} not found" if prod is None else
                   "no payload" if data is None else "checksum mismatch")
            conn.reply(p.SEND_ERROR, producer_id=pid, sequence_id=seq,
                       error=p.CHECKSUM_ERROR if not crc_ok else p.UNKNOWN_ERROR, message=why)
            return
        topic, name = prod
        highest = c.highest_sequence_id if c.HasField("highest_sequence_id") else seq
        if seq <= topic.last_sequence.get(name, -1):  # a resend after reconnecting: already stored
            index = topic.receipts.get((name, seq), -1)
        else:
            meta, _ = p.split_metadata(data)
            n = meta.num_messages_in_batch if meta.HasField("num_messages_in_batch") else 1
            entry = Entry(blob=data, crc=_crc(data), publish_time=meta.publish_time, num_messages=max(1, n))
            index = topic.append(entry, name, seq, highest)
        conn.reply(p.SEND_RECEIPT, producer_id=pid, sequence_id=seq, highest_sequence_id=highest,
                   message_id=p.message_id(topic.ledger, index))

    def _on_subscribe(self, conn: _Conn, c) -> None:
        topic = self._topic(c.topic)
        sub = topic.subscriptions.get(c.subscription)
        old = conn.consumers.pop(c.consumer_id, None)  # the client re-subscribing the same consumer
        if old is not None:
            self._remove_consumer(old)
            sub = topic.subscriptions.get(c.subscription)
        durable = c.durable if c.HasField("durable") else True
        if sub is None:
            sub = Subscription(c.subscription, topic, c.subType, durable)
            if not durable and c.HasField("start_message_id"):
                sub.reset(topic.index_of(c.start_message_id))
            elif c.initialPosition == p.INITIAL_EARLIEST:
                sub.reset(0)
            else:
                sub.reset(len(topic.entries))
            topic.subscriptions[c.subscription] = sub
        elif sub.consumers and (sub.sub_type == p.SUB_EXCLUSIVE or c.subType != sub.sub_type):
            conn.reply(p.ERROR, request_id=c.request_id, error=p.CONSUMER_BUSY,
                       message=f"Exclusive consumer is already connected to subscription {c.subscription}")
            return
        sub.sub_type = c.subType
        cs = ConsumerState(c.consumer_id, c.consumer_name, sub, conn.send)
        sub.consumers.append(cs)
        conn.consumers[c.consumer_id] = cs
        conn.reply(p.SUCCESS, request_id=c.request_id)

    def _remove_consumer(self, cs: ConsumerState) -> None:
        sub = cs.sub
        sub.detach(cs)
        if not sub.durable and not sub.consumers:
            sub.topic.subscriptions.pop(sub.name, None)
        else:
            sub.dispatch()

    def _on_ack(self, conn: _Conn, c) -> None:
        cs = conn.consumers.get(c.consumer_id)
        if cs is not None:
            for mid in c.message_id:
                if any(mid.ack_set):  # part of a batch still unacknowledged: the entry stays
                    continue
                cs.sub.ack(cs.sub.topic.index_of(mid), c.ack_type == p.ACK_CUMULATIVE)
        if c.HasField("request_id"):
            conn.reply(p.ACK_RESPONSE, consumer_id=c.consumer_id, request_id=c.request_id)

    def _on_seek(self, conn: _Conn, c) -> None:
        cs = conn.consumers.get(c.consumer_id)
        if cs is None:
            conn.reply(p.ERROR, request_id=c.request_id, error=p.CONSUMER_NOT_FOUND,
                       message=f"consumer {c.consumer_id} not found")
            return
        sub, topic = cs.sub, cs.sub.topic
        index = (topic.index_of(c.message_id) if c.HasField("message_id")
                 else topic.index_at_time(c.message_publish_time))
        # As the real broker: every consumer of the subscription is disconnected (the client
        # re-subscribes), then the cursor moves, then the seek succeeds.
        for other in list(sub.consumers):
            other.send(p.encode_frame(p.command(p.CLOSE_CONSUMER, consumer_id=other.consumer_id,
                                                request_id=p.U64_MAX)))
            sub.detach(other)
            for owner in self._conns:
                if owner.consumers.get(other.consumer_id) is other:
                    del owner.consumers[other.consumer_id]
        sub.reset(index)
        conn.reply(p.SUCCESS, request_id=c.request_id)

    # -- admin REST: the topic list of a namespace ---------------------------------------------------
    async def _serve_http(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            method, path = request.split(b" ", 2)[:2]
            parts = path.decode().split("?")[0].strip("/").split("/")
            if method == b"GET" and len(parts) == 5 and parts[:3] == ["admin", "v2", "persistent"]:
                prefix = f"persistent://{parts[3]}/{parts[4]}/"
                status, body = "200 OK", json.dumps(sorted(n for n in self.topics if n.startswith(prefix)))
            else:
                status, body = "404 Not Found", json.dumps({"reason": f"not served by the test broker: {path!r}"})
            raw = body.encode()
            writer.write(f"HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {len(raw)}\r\n"
                         f"Connection: close\r\n\r\n".encode() + raw)
            await writer.drain()
        except (asyncio.IncompleteReadError, asyncio.TimeoutError, ConnectionError, ValueError):
            pass
        finally:
            writer.close()


def _crc(data: bytes) -> int:
    import crc32c

    return crc32c.crc32c(data)
