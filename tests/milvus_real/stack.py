"""A real Milvus 2.3.5 together with the message queue it writes to, started and stopped as one.

``kafka_stack``: tansu behind the ApiVersions shim (tests/fixtures/kafka_shim.py) — the Kafka
suite, tests/milvus_real. ``pulsar_stack``: pulsar-lite (tests/fixtures/pulsar_lite.py), an
independent Pulsar-protocol broker, behind the Pulsar shim (tests/fixtures/pulsar_shim.py) —
tests/milvus_real_pulsar. Every process is stopped by its pid
when the ``with`` block ends, also when Milvus fails to start. ``env`` is this project's config for
the same MQ, for the readers under test.

pulsar-lite has no admin REST API, so this project cannot list its topics (``channelPattern``):
reads there name the collection's physical channels (``channel_options``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

from tests.fixtures.backend_env import BackendEnv
from tests.milvus_real.server import MilvusServer, kafka_mq, pulsar_mq

ALIAS = "real"  # pymilvus's connection alias for the stack's server (the ``pymilvus_orm`` fixture)
PATTERN = "by-dev-rootcoord-dml_.*"  # Milvus's DML channels


@dataclass
class MilvusStack:
    server: MilvusServer
    env: BackendEnv  # this project's config for the MQ Milvus writes to

    @property
    def uri(self) -> str:
        return self.server.uri

    @property
    def mq(self) -> str:
        """``mq.type``: kafka or pulsar."""
        return self.env.name

    @property
    def can_list_channels(self) -> bool:
        return self.mq == "kafka"  # pulsar-lite has no admin REST API to list topics

    def channel_options(self, collection: str) -> dict[str, str]:
        """The source's option naming the channels of ``collection``: Milvus's DML channel pattern where the
        MQ lists its topics, else the collection's physical channels as Milvus describes them."""
        if self.can_list_channels:
            return {"channelPattern": PATTERN}
        return {"channels": ",".join(pchannels(ALIAS, collection))}

    def dml_channels(self, collection: str) -> list[str]:
        """Every DML channel Milvus wrote to, where the MQ lists them; else the collection's own."""
        if not self.can_list_channels:
            return pchannels(ALIAS, collection)
        with self.env.client() as c:
            return sorted(ch for ch in c.list_channels() if ch.startswith("by-dev-rootcoord-dml_"))


def pchannels(alias: str, name: str, db: str = "") -> list[str]:
    """The physical channels Milvus gave collection ``name`` of database ``db`` (DescribeCollection's raw answer).
    An error answer (no such collection there) raises: an empty list would make every wait on the channels pass."""
    from pymilvus import connections
    from pymilvus.grpc_gen import milvus_pb2

    stub = connections._fetch_handler(alias)._stub
    resp = stub.DescribeCollection(milvus_pb2.DescribeCollectionRequest(db_name=db, collection_name=name), timeout=30)
    if resp.status.error_code or resp.status.code or not resp.physical_channel_names:
        raise AssertionError(f"DescribeCollection of {db or 'default'}.{name}: {resp.status.reason or 'no channels'}")
    return sorted(resp.physical_channel_names)


@contextlib.contextmanager
def kafka_stack() -> Iterator[MilvusStack]:
    """Milvus on tansu, through the shim (librdkafka 1.9.1 cannot read tansu's ApiVersions v3 answer)."""
    from tests.fixtures.kafka_env import kafka_config
    from tests.fixtures.kafka_shim import KafkaShim
    from tests.fixtures.ports import free_port
    from tests.fixtures.tansu import TansuBroker

    shim_port = free_port()
    broker = TansuBroker(advertised_port=shim_port)
    shim = KafkaShim(("127.0.0.1", broker.port), shim_port).start()
    server = None
    try:
        broker.start()
        server = MilvusServer(kafka_mq(f"127.0.0.1:{shim_port}")).start()
        yield MilvusStack(server, BackendEnv("kafka", kafka_config(f"127.0.0.1:{shim_port}")))
    finally:
        if server is not None:
            server.stop()
            server.cleanup()
        shim.stop()
        broker.kill()


@contextlib.contextmanager
def pulsar_stack() -> Iterator[MilvusStack]:
    """Milvus on pulsar-lite through the Pulsar shim (tests/fixtures/pulsar_shim.py: pulsar-client-go needs
    a checksum on every message and the consumer disconnect Pulsar does after a seek); this project's
    client reads pulsar-lite directly. ``pulsar.webport`` is pulsar-lite's metrics port: Milvus 2.3.5 calls
    the admin REST API only to drop the subscriptions of a dropped collection (and logs a warning)."""
    from tests.fixtures.ports import free_port
    from tests.fixtures.pulsar_env import pulsar_config
    from tests.fixtures.pulsar_lite import PulsarLiteBroker
    from tests.fixtures.pulsar_shim import PulsarShim

    with PulsarLiteBroker() as broker:
        shim = PulsarShim(("127.0.0.1", broker.port), free_port()).start()
        server = MilvusServer(pulsar_mq("127.0.0.1", shim.port, broker.web_port))
        try:
            server.start()
            yield MilvusStack(server, BackendEnv("pulsar", pulsar_config(broker.url, broker.web_port),
                                                 extras={"pulsar_lite": broker, "shim": shim}))
            assert not shim.errors, f"the Pulsar shim could not relay: {shim.errors[:5]}"
        finally:
            server.stop()
            server.cleanup()
            shim.stop()
