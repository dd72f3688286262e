"""Shared fixtures. Each backend's fixtures live in tests/fixtures/<backend>_env.py.

``backend`` is parametrised over every backend, so a test written once runs on the
embedded log, on Kafka (tansu or an external broker), on Pulsar (the suite's own
broker or an external one) and on pulsar-lite (an independent, persistent Pulsar broker).
"""

from __future__ import annotations

import os

import pytest

from tests.fixtures.login_env import DECOYS

# A login shell's generic variables (USER, TOKEN, ADDRESS, ...) are in every test's environment,
# and so in every Spark worker and subprocess started from it; none may change a config.
os.environ.update(DECOYS)

pytest_plugins = [
    "tests.fixtures.local_env",
    "tests.fixtures.kafka_env",
    "tests.fixtures.pulsar_env",
    "tests.fixtures.pulsar_lite_env",
    "tests.fixtures.milvus_env",
    "tests.fixtures.spark_env",
    "tests.fixtures.spark_connect",
    "tests.fixtures.wheel_env",
    "tests.fixtures.spark_cluster",
]

BACKENDS = ["local", "kafka", "pulsar", "pulsar-lite"]
# Backends the read-side tests also run on: ``milvus`` is read-only (its env writes entries into the
# store its test proxy serves, through ``extras["writer"]``).
READ_BACKENDS = [*BACKENDS, "milvus"]


@pytest.fixture(params=BACKENDS)
def backend(request):
    """A :class:`tests.fixtures.backend_env.BackendEnv` for each backend in turn."""
    return request.getfixturevalue(f"{request.param.replace('-', '_')}_env")


@pytest.fixture(params=READ_BACKENDS)
def read_backend(request):
    """Like ``backend``, plus the read-only ``milvus`` backend."""
    return request.getfixturevalue(f"{request.param.replace('-', '_')}_env")


def pytest_collection_modifyitems(items):
    """Every test that starts Spark is ``slow`` (``make test-fast`` runs the others)."""
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
