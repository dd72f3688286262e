"""Shared fixtures. Each backend's fixtures live in tests/fixtures/<backend>_env.py.

``backend`` is parametrised over every backend, so a test written once runs on the
embedded log, on Kafka (tansu or an external broker), on Pulsar (the suite's own
broker or an external one) and on pulsar-lite (an independent, persistent Pulsar broker).
"""

from __future__ import annotations

import os

import pytest

from tests.fixtures.login_env import DECOYS

# Every JVM the suite starts (the SparkSession, spark-submit drivers, the Spark Connect server, the standalone
# cluster's daemons) lives for seconds to minutes and runs little data: the C1 compiler alone (no C2 tier) halves
# the CPU they take to start and warm up (a SparkSession and 20 small jobs: 15 s instead of 26 s of CPU), which is
# what the tests wait on with 2 cores. An explicitly set variable is left alone.
QUICK_JVM = "-XX:TieredStopAtLevel=1"
for _var in ("SPARK_SUBMIT_OPTS", "SPARK_DAEMON_JAVA_OPTS"):
    os.environ.setdefault(_var, QUICK_JVM)

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
    "tests.fixtures.suite_profile",
    "pytester",
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


# ``make test`` spreads the suite over pytest-xdist workers with ``--dist loadgroup``; every worker has its own
# session fixtures, so tests sharing an expensive process are kept in one ``xdist_group`` (one worker starts it
# once). First match wins: the real Milvus, the standalone cluster and the Spark Connect server each get a worker
# of their own (module/package-scoped, torn down when their tests end); the SparkSession tests are split by
# path into two groups of about equal time (the chaos suite and most of tests/spark; the rest), i.e. at most two
# local SparkSessions (plus those three) run at once.
EXCLUSIVE_FIXTURES = {"milvus_stack": "milvus-real", "spark_cluster": "spark-cluster",
                      "spark_connect_url": "spark-connect"}
# The real-Milvus tests in three groups of about equal time, each on its own worker with its own Milvus (the
# fixture is package-scoped, so every worker that runs a package's tests starts that package's server once).
MILVUS_GROUPS = (("tests/milvus_real_pulsar/", "milvus-real-pulsar"),
                 ("tests/milvus_real/test_mirror.py", "milvus-real-mirror"),
                 ("tests/milvus_real/test_mirror_storage.py", "milvus-real-mirror"))
SPARK_GROUP_B = ("tests/stream/", "tests/sink/", "tests/jobs/", "tests/conformance/", "tests/packaging/",
                 "tests/mq_milvus/", "tests/config/", "tests/spark/test_source")


# The order xdist hands the groups out (``make test`` runs with --no-loadscope-reorder): the longest first,
# so that no long group starts last on a worker that already ran another (longest-processing-time-first).
GROUP_ORDER = ("spark-cluster", "milvus-real-mirror", "milvus-real", "spark-a", "spark-b", "milvus-real-pulsar",
               "spark-connect")


def xdist_group(item) -> str | None:
    """The worker group of a test (None: any worker)."""
    names = getattr(item, "fixturenames", ())
    if "milvus_stack" in names:
        return next((g for prefix, g in MILVUS_GROUPS if item.nodeid.startswith(prefix)), "milvus-real")
    for fixture, group in EXCLUSIVE_FIXTURES.items():
        if fixture in names:
            return group
    if "spark" not in names:
        return None
    return "spark-b" if item.nodeid.startswith(SPARK_GROUP_B) else "spark-a"


# tryfirst: xdist's worker reads the ``xdist_group`` marks in its own pytest_collection_modifyitems, which is
# registered after this conftest and so would otherwise run before this one.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """Every test that starts Spark is ``slow`` (``make test-fast`` runs the others); groups for xdist."""
    rank = {g: i for i, g in enumerate(GROUP_ORDER)}
    order = {}
    for item in items:
        if "spark" in getattr(item, "fixturenames", ()):
            item.add_marker(pytest.mark.slow)
        group = xdist_group(item)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
        order[item.nodeid] = rank.get(group, len(rank))
    items.sort(key=lambda it: order[it.nodeid])  # stable: each group keeps its order


class _GroupCheck:
    """In an xdist worker under ``--dist loadgroup``: fail loudly if xdist did not apply the groups (it renames a
    grouped test ``<nodeid>@<group>``; pytest 9.2 ignores that rename), rather than start a JVM per worker."""

    @pytest.hookimpl(trylast=True)
    def pytest_collection_modifyitems(self, config, items):
        if not getattr(config.option, "loadgroup", False):
            return
        for item in items:
            group = xdist_group(item)
            if group is not None and not item.nodeid.endswith(f"@{group}"):
                raise pytest.UsageError(f"pytest-xdist did not apply the xdist_group {group!r} to {item.nodeid} "
                                        f"(pytest {pytest.__version__} with this pytest-xdist?)")


def pytest_configure(config):
    config.pluginmanager.register(_GroupCheck(), "msgstream-xdist-group-check")
