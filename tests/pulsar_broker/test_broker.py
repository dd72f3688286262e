"""The test broker against the unmodified pulsar-client, and frame by frame over a raw socket."""

from __future__ import annotations

import json
import socket
import struct
import time
import urllib.request

import pulsar
import pytest

from tests.pulsar_broker import PulsarTestBroker
from tests.pulsar_broker import protocol as p

pytestmark = pytest.mark.timeout(120)
NS = "persistent://public/default/"


@pytest.fixture(scope="module")
def broker():
    with PulsarTestBroker() as b:
        yield b


@pytest.fixture
def client(broker):
    c = pulsar.Client(broker.url, operation_timeout_seconds=10, logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Warn))
    yield c
    c.close()


def topic(name: str) -> str:
    return NS + name + f"-{time.monotonic_ns()}"


def wait_until(cond, what: str, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not cond():
        assert time.monotonic() < deadline, f"{what}: not within {timeout:.0f} s"
        time.sleep(0.02)


def drain(consumer, timeout_ms: int = 1000) -> list:
    out = []
    while True:
        try:
            out.append(consumer.receive(timeout_ms))
        except pulsar.Timeout:
            return out


def test_produce_consume_with_properties_zstd_and_ids(client, broker):
    t = topic("basic")
    prod = client.create_producer(t, batching_enabled=False, compression_type=pulsar.CompressionType.ZSTD)
    ids = [prod.send(f"m{i}".encode() * 100, properties={"i": str(i)}) for i in range(5)]
    assert [i.entry_id() for i in ids] == [0, 1, 2, 3, 4]
    assert len({i.ledger_id() for i in ids}) == 1
    cons = client.subscribe(t, "s", initial_position=pulsar.InitialPosition.Earliest)
    got = drain(cons)
    assert [m.data() for m in got] == [f"m{i}".encode() * 100 for i in range(5)]
    assert [m.properties() for m in got] == [{"i": str(i)} for i in range(5)]
    assert [m.message_id().entry_id() for m in got] == [0, 1, 2, 3, 4]
    assert all(m.publish_timestamp() > 0 for m in got)
    assert broker.entry_count(t) == 5


def test_batched_producer_is_delivered_message_by_message(client):
    t = topic("batched")
    prod = client.create_producer(t, batching_enabled=True, batching_max_messages=10,
                                  batching_max_publish_delay_ms=50)
    for i in range(25):
        prod.send_async(str(i).encode(), None)
    prod.flush()
    cons = client.subscribe(t, "s", initial_position=pulsar.InitialPosition.Earliest)
    got = drain(cons)
    assert [m.data() for m in got] == [str(i).encode() for i in range(25)]
    assert max(m.message_id().batch_index() for m in got) > 0  # really batched entries
    last = cons.get_last_message_id()
    assert (last.entry_id(), last.batch_index()) == (got[-1].message_id().entry_id(),
                                                     got[-1].message_id().batch_index())


def test_initial_positions_and_exclusive_busy(client):
    t = topic("positions")
    prod = client.create_producer(t)
    prod.send(b"old")
    late = client.subscribe(t, "latest", initial_position=pulsar.InitialPosition.Latest)
    early = client.subscribe(t, "earliest", initial_position=pulsar.InitialPosition.Earliest)
    prod.send(b"new")
    assert [m.data() for m in drain(late)] == [b"new"]
    assert [m.data() for m in drain(early)] == [b"old", b"new"]
    with pytest.raises(pulsar.ConsumerBusy):
        client.subscribe(t, "latest")


def test_shared_subscription_splits_messages(client):
    t = topic("shared")
    a = client.subscribe(t, "sh", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=10)
    b = client.subscribe(t, "sh", consumer_type=pulsar.ConsumerType.Shared, receiver_queue_size=10)
    prod = client.create_producer(t)
    for i in range(40):
        prod.send(str(i).encode())
    got_a, got_b = drain(a), drain(b)
    assert got_a and got_b
    assert sorted(int(m.data()) for m in got_a + got_b) == list(range(40))


def test_ack_close_resubscribe_resumes_and_redelivers_unacked(client):
    t = topic("resume")
    prod = client.create_producer(t)
    for i in range(6):
        prod.send(str(i).encode())
    c = client.subscribe(t, "durable", initial_position=pulsar.InitialPosition.Earliest)
    got = drain(c)
    for m in got[:3]:
        c.acknowledge(m)
    c.acknowledge(got[4])  # a gap: 3 stays unacknowledged
    c.close()
    c = client.subscribe(t, "durable", initial_position=pulsar.InitialPosition.Earliest)
    assert [m.data() for m in drain(c)] == [b"3", b"5"]
    c.acknowledge_cumulative(got[-1])
    c.close()
    c = client.subscribe(t, "durable")
    assert drain(c, 300) == []


def test_seek_by_id_and_by_publish_time(client):
    t = topic("seek")
    prod = client.create_producer(t)
    ids = []
    for i in range(6):
        ids.append(prod.send(str(i).encode()))
    c = client.subscribe(t, "seeker", initial_position=pulsar.InitialPosition.Latest, start_message_id_inclusive=True)
    c.seek(ids[2])  # the broker drops the consumer; the client re-subscribes
    assert [m.data() for m in drain(c)] == [b"2", b"3", b"4", b"5"]
    c.seek(0)  # publish time 0: from the start
    assert [m.data() for m in drain(c)][0] == b"0"
    c.seek(int(time.time() * 1000) + 60_000)  # after everything
    assert drain(c, 300) == []


def test_last_message_id_empty_and_unsubscribe(client, broker):
    t = topic("last")
    c = client.subscribe(t, "probe")
    assert c.get_last_message_id().entry_id() < 0
    prod = client.create_producer(t)
    mid = prod.send(b"x")
    assert c.get_last_message_id().entry_id() == mid.entry_id()
    assert broker.subscription_names(t) == ["probe"]
    c.unsubscribe()
    assert broker.subscription_names(t) == []


def test_token_authentication():
    with PulsarTestBroker(token="s3cret") as b:
        good = pulsar.Client(b.url, authentication=pulsar.AuthenticationToken("s3cret"), operation_timeout_seconds=5,
                             logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        good.create_producer(NS + "auth").send(b"ok")
        good.close()
        bad = pulsar.Client(b.url, authentication=pulsar.AuthenticationToken("wrong"), operation_timeout_seconds=3,
                            logger=pulsar.ConsoleLogger(pulsar.LoggerLevel.Error))
        with pytest.raises(pulsar.PulsarException):
            bad.create_producer(NS + "auth")
        bad.close()
        assert b.entry_count(NS + "auth") == 1


def test_admin_topic_list(client, broker):
    t = topic("listed")
    client.create_producer(t).send(b"x")
    with urllib.request.urlopen(f"{broker.web_url}/admin/v2/persistent/public/default", timeout=10) as r:
        assert t in json.loads(r.read())
    with pytest.raises(urllib.error.HTTPError):
        urllib.request.urlopen(f"{broker.web_url}/admin/v2/clusters", timeout=10)


@pytest.mark.slow  # a broker or process fault: waits out real timeouts
def test_dropped_connections_reconnect_without_loss(client, broker):
    t = topic("drop")
    prod = client.create_producer(t)
    c = client.subscribe(t, "d", initial_position=pulsar.InitialPosition.Earliest)
    for i in range(10):
        prod.send(str(i).encode())
    first = drain(c)
    for m in first[:5]:
        c.acknowledge(m)
    # the client groups acks for up to 100 ms
    wait_until(lambda: broker.mark_delete(t, "d") == 4, "the broker's mark-delete position at the 5th ack")
    assert broker.drop_connections() >= 1
    for i in range(10, 15):
        prod.send(str(i).encode())  # the producer reconnects
    got = [int(m.data()) for m in drain(c)]
    assert set(range(5, 15)) <= set(got)  # unacknowledged ones come again; nothing is lost
    assert broker.entry_count(t) == 15  # and nothing was stored twice


# -- frame by frame ---------------------------------------------------------------------------------------
class Raw:
    def __init__(self, port: int) -> None:
        self.sock = socket.create_connection(("127.0.0.1", port), timeout=10)

    def send(self, frame: bytes) -> None:
        self.sock.sendall(frame)

    def recv(self):
        size = struct.unpack(">I", self._exact(4))[0]
        return p.decode_frame(self._exact(size))[0]

    def _exact(self, n: int) -> bytes:
        buf = b""
        while len(buf) < n:
            chunk = self.sock.recv(n - len(buf))
            if not chunk:
                raise ConnectionError("closed by the broker")
            buf += chunk
        return buf


def test_raw_frames_connect_ping_lookup_and_checksum(broker):
    raw = Raw(broker.port)
    raw.send(p.encode_frame(p.command(p.CONNECT, client_version="raw-test", protocol_version=19)))
    assert raw.recv().connected.server_version == "msgstream-test-broker"
    raw.send(p.encode_frame(p.command(p.PING)))
    assert raw.recv().type == p.PONG
    raw.send(p.encode_frame(p.command(p.PARTITIONED_METADATA, topic=NS + "raw", request_id=1)))
    r = raw.recv().partitionMetadataResponse
    assert (r.request_id, r.partitions) == (1, 0)
    raw.send(p.encode_frame(p.command(p.LOOKUP, topic=NS + "raw", request_id=2)))
    r = raw.recv().lookupTopicResponse
    assert (r.request_id, r.response, r.brokerServiceUrl) == (2, p.LOOKUP_CONNECT, broker.url)
    raw.send(p.encode_frame(p.command(p.PRODUCER, topic=NS + "raw", producer_id=7, request_id=3)))
    assert raw.recv().producer_success.request_id == 3
    meta = p.MessageMetadata(producer_name="raw", sequence_id=0, publish_time=1)
    blob = p.join_metadata(meta, b"payload")
    raw.send(p.encode_frame(p.command(p.SEND, producer_id=7, sequence_id=0), blob, checksum=0xDEADBEEF))
    err = raw.recv()
    assert err.type == p.SEND_ERROR and err.send_error.error == p.CHECKSUM_ERROR
    raw.send(p.encode_frame(p.command(p.SEND, producer_id=7, sequence_id=0), blob))
    receipt = raw.recv().send_receipt
    assert (receipt.sequence_id, receipt.message_id.entryId) == (0, 0)
    assert broker.entry_count(NS + "raw") == 1


def test_raw_command_before_connect_closes_the_connection(broker):
    raw = Raw(broker.port)
    raw.send(p.encode_frame(p.command(p.PING)))
    with pytest.raises(ConnectionError):
        raw.recv()


def test_readers_use_non_durable_subscriptions(client, broker):
    t = topic("reader")
    prod = client.create_producer(t)
    ids = [prod.send(b"%d" % i) for i in range(5)]

    def read_all(start, inclusive=False) -> list[bytes]:
        r = client.create_reader(t, start, start_message_id_inclusive=inclusive)
        out = []
        while r.has_message_available():  # asks the broker for the last message id
            out.append(r.read_next(2000).data())
        r.close()
        return out

    assert read_all(pulsar.MessageId.earliest) == [b"0", b"1", b"2", b"3", b"4"]
    assert read_all(ids[1]) == [b"2", b"3", b"4"]
    assert read_all(ids[1], inclusive=True) == [b"1", b"2", b"3", b"4"]
    assert broker.subscription_names(t) == []  # nothing left behind
