"""A real Milvus 2.3.5 on tansu (through the ApiVersions shim), once for this directory's tests.

Start-up is bounded (``MilvusServer.startup_timeout``); every process started here is stopped by
pid; Milvus's own logs are printed when start-up fails and kept in the report of a failing test.
Set ``MSGSTREAM_SKIP_MILVUS=1`` to skip the module where the wheel cannot be fetched.
"""

from __future__ import annotations

import os
import warnings
from dataclasses import dataclass

import pytest

from tests.fixtures.backend_env import BackendEnv
from tests.fixtures.kafka_env import kafka_config
from tests.fixtures.kafka_shim import KafkaShim
from tests.fixtures.tansu import TansuBroker, free_port
from tests.milvus_real.server import MilvusServer


@dataclass
class MilvusStack:
    server: MilvusServer
    shim: KafkaShim
    env: BackendEnv  # this project's Kafka config, through the shim

    @property
    def uri(self) -> str:
        return self.server.uri


# Package-scoped: Milvus (its timers tick every 200 ms) is up only while this directory's tests run.
@pytest.fixture(scope="package")
def milvus_stack():
    if os.environ.get("MSGSTREAM_SKIP_MILVUS"):
        pytest.skip("MSGSTREAM_SKIP_MILVUS is set")
    shim_port = free_port()
    broker = TansuBroker(advertised_port=shim_port)
    shim = KafkaShim(("127.0.0.1", broker.port), shim_port).start()
    server = None
    try:
        broker.start()
        server = MilvusServer(f"127.0.0.1:{shim_port}").start()
        env = BackendEnv("kafka", kafka_config(f"127.0.0.1:{shim_port}"))
        yield MilvusStack(server, shim, env)
    finally:
        if server is not None:
            server.stop()
            server.cleanup()
        shim.stop()
        broker.kill()


@pytest.fixture(autouse=True)
def _milvus_log_on_failure(request):
    """Milvus's log tail in the report of a failing test of this directory."""
    yield
    rep = getattr(request.node, "rep_call", None)
    if rep is not None and rep.failed and "milvus_stack" in request.fixturenames:
        stack = request.getfixturevalue("milvus_stack")
        print("\n--- Milvus log (tail) ---\n" + stack.server.log_tail(4000))


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    rep = outcome.get_result()
    if rep.when == "call":
        item.rep_call = rep


@pytest.fixture(scope="package")
def pymilvus_orm(milvus_stack):
    """pymilvus's ORM connected to the server (the project's pymilvus drives Milvus 2.3.5)."""
    warnings.filterwarnings("ignore", message=".*ORM-style PyMilvus API.*")
    from pymilvus import connections

    connections.connect("real", uri=milvus_stack.uri, timeout=30)
    yield "real"
    connections.disconnect("real")
