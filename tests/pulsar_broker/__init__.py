"""An in-memory broker speaking Pulsar's binary protocol, for tests driven by the real pulsar-client."""

from tests.pulsar_broker.server import PulsarTestBroker

__all__ = ["PulsarTestBroker"]
