"""What pulsar-lite 0.2.0 puts on the wire, checked byte by byte against the Pulsar frame format.

A payload command frame is ``[total size][cmd size][BaseCommand][0x0e01][CRC32C][metadata
size][MessageMetadata][payload]`` (an optional ``0x0e02`` broker-entry-metadata section may
come before the magic), the CRC32C (Castagnoli) covering everything after itself. Recorded
through a relay while pulsar-client (C++ core) produces and consumes:

* the producer's SEND frames carry the magic and a correct CRC32C (computed here);
* pulsar-lite's MESSAGE frames carry neither: right after the BaseCommand comes the metadata
  size. The bytes are otherwise exactly what the producer checksummed (its CRC matches them),
  so the checksum is dropped, not wrong. Apache Pulsar brokers strip it only for clients
  announcing a protocol version below 11 (the client here announces more). pulsar-client's
  C++ core skips verification when the magic is absent, so it accepts these messages; the Go
  client in Milvus 2.3.5 (milvus-io/pulsar-client-go v0.6.10) requires the magic, and reports
  its absence as ``validationError=ChecksumMismatch``: why Milvus discards every message.

If this test fails after a pulsar-lite upgrade because MESSAGE frames now carry the checksum,
pulsar-lite has been fixed: check the frames are right, then try Milvus over Pulsar again.
"""

from __future__ import annotations

import struct

import crc32c
import pytest

from tests.fixtures.pulsar_relay import RecordingRelay
from tests.pulsar_broker import protocol as P

pulsar = pytest.importorskip("pulsar")

MAGIC_BROKER_ENTRY_METADATA = 0x0E02
N = 3


def split(frame: bytes) -> tuple[P.BaseCommand, bytes]:
    """A recorded frame (after its total size) as its command and the bytes after the command."""
    (cmd_size,) = struct.unpack_from(">I", frame, 0)
    return P.BaseCommand.FromString(frame[4:4 + cmd_size]), frame[4 + cmd_size:]


def produce_and_consume(url: str, topic: str, batching: bool) -> list[bytes]:
    client = pulsar.Client(url, operation_timeout_seconds=15)
    try:
        producer = client.create_producer(topic, batching_enabled=batching)
        for i in range(N):
            producer.send(b"hello-%d" % i, properties={"i": str(i)})
        producer.flush()
        consumer = client.subscribe(topic, "frames", initial_position=pulsar.InitialPosition.Earliest)
        got = []
        for _ in range(N):
            msg = consumer.receive(15000)
            consumer.acknowledge(msg)
            got.append(msg.data())
        return got
    finally:
        client.close()


@pytest.mark.parametrize("batching", [False, True], ids=["single", "batched"])
def test_pulsar_lite_delivers_messages_without_the_checksum(pulsar_lite_broker, batching):
    with RecordingRelay(pulsar_lite_broker.port) as relay:
        got = produce_and_consume(relay.url, f"persistent://public/default/frames-{int(batching)}", batching)
        frames = relay.recorded()
    assert got == [b"hello-%d" % i for i in range(N)]

    connect = [split(f)[0] for d, f in frames if d == "c2b" and split(f)[0].type == P.CONNECT]
    assert connect and connect[0].connect.protocol_version >= 11  # Apache Pulsar would keep the CRC

    sent: dict[bytes, int] = {}  # checksummed bytes -> the producer's CRC32C
    for d, f in frames:
        cmd, rest = split(f)
        if d == "c2b" and cmd.type == P.SEND:
            magic, crc = struct.unpack_from(">HI", rest, 0)
            assert magic == P.MAGIC_CRC32C
            assert crc == crc32c.crc32c(rest[6:]), "the producer's CRC32C covers everything after itself"
            sent[rest[6:]] = crc
    assert len(sent) == N

    delivered = [split(f)[1] for d, f in frames if d == "b2c" and split(f)[0].type == P.MESSAGE]
    assert len(delivered) == N
    for rest in delivered:
        assert struct.unpack_from(">H", rest, 0)[0] not in (P.MAGIC_CRC32C, MAGIC_BROKER_ENTRY_METADATA)
        assert rest in sent, "after the command comes [metadata size][metadata][payload] as the producer sent it"
        assert crc32c.crc32c(rest) == sent[rest]  # the checksum could be sent as is: it is dropped
        meta, payload = P.split_metadata(rest)
        assert payload.endswith(b"hello-%d" % meta.sequence_id)
