"""Shared fixtures. Each backend's fixtures live in tests/fixtures/<backend>_env.py.

``backend`` is parametrised over every backend, so a test written once runs on the
embedded log, on Kafka (tansu or an external broker), on Pulsar (the suite's own
broker or an external one) and on pulsar-lite (an independent, persistent Pulsar broker).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile

import pytest

from tests.fixtures.jvm_cds import PYTHON_DAEMON, jvm_options
from tests.fixtures.login_env import DECOYS

# Every JVM the suite starts (the SparkSession, spark-submit drivers, the Spark Connect server, the standalone
# cluster's daemons) lives for seconds to minutes and runs little data: the C1 compiler alone (no C2 tier) halves
# the CPU they take to start and warm up (a SparkSession and 20 small jobs: 15 s instead of 26 s of CPU), the
# serial collector takes ~8% less than G1's threads on 2 cores, and the class-data-sharing archive ``make install``
# makes (tests/fixtures/jvm_cds.py) a further ~25% of a JVM's start: that is what the tests wait on with 2 cores.
# An explicitly set variable is left alone.
# The drivers' JVMs (spark-submit's: SparkSessions, job drivers, the Spark Connect server) also get a Spark property,
# PYTHON_DAEMON (a session's or --conf's own setting wins): Python workers forked with msgstream's modules already
# imported (msgstream_spark/spark/daemon.py), each ~0.01 s of CPU before its first task instead of ~0.7 s (the
# cluster's applications go without: tests/fixtures/spark_cluster.py).
# Their temporary files (block managers, artifacts, native libraries unpacked, a killed driver's leftovers) go to a
# directory of the run's, removed when the process that made it exits: a SIGKILLed JVM cleans nothing, and a day of
# runs left thousands of such directories in /tmp. Made once, by the first process (xdist's workers inherit it).
if "SUITE_JVM_TMPDIR" not in os.environ:
    os.environ["SUITE_JVM_TMPDIR"] = tempfile.mkdtemp(prefix="msgstream-suite-jvm-")
    atexit.register(shutil.rmtree, os.environ["SUITE_JVM_TMPDIR"], True)
QUICK_JVM = f"{jvm_options()} -Djava.io.tmpdir={os.environ['SUITE_JVM_TMPDIR']}"
os.environ.setdefault("SPARK_SUBMIT_OPTS", f"{QUICK_JVM} {PYTHON_DAEMON}")
os.environ.setdefault("SPARK_DAEMON_JAVA_OPTS", QUICK_JVM)

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
    "tests.fixtures.s3_env",
    "tests.fixtures.emulators",
    "tests.fixtures.postgres_env",
    "tests.fixtures.rest_catalog_env",
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


# ``make test`` spreads the suite over pytest-xdist workers with ``--dist loadgroup``: the tests of a group run on
# one worker, one after another, and xdist hands each group, and each test of no group, to a free worker. A test's
# group follows from its fixtures, so a new test finds its group by itself (docs/testing.md, "Groups"):
#   1. the users of the built wheel's venv (one directory on disk: one worker at a time): group ``wheel``;
#   2. a test that uses a process started for many tests (PROCESS_FIXTURES: a local SparkSession, the real
#      Milvus, the standalone cluster, the Spark Connect server): its module is its group, so a module's fixtures
#      start once and whole modules are balanced over the workers. The SparkSession is session-scoped (a worker
#      starts it when it first needs one; its later modules share it), the others module-scoped; the tests that
#      share one are isolated by names (collections, topics, table paths), never by a fresh server;
#   3. a test of the Iceberg REST catalog server (SHARED_SERVERS: ~10 s of CPU to start, used by a few tests):
#      group ``rest-catalog``, so one worker starts it (a parameter that takes it with ``getfixturevalue`` says
#      so with ``pytest.mark.xdist_group("rest-catalog")``: a test's own mark comes first);
#   4. any other test: no group. The cheap servers a worker starts once for all its tests (moto's S3 server,
#      PostgreSQL: ~1 s of CPU each, session-scoped) need no group: each test takes a bucket or database of its own.
PROCESS_FIXTURES = ("spark", "milvus_stack", "spark_cluster", "spark_connect_url")
SHARED_DIRECTORY = {"built_wheel": "wheel", "wheel_python": "wheel"}
SHARED_SERVERS = {"rest_catalog": "rest-catalog"}
# Groups whose tests ``make test-fast`` leaves out (marked ``slow``) though they start no Spark: ``wheel`` builds the
# wheel (~20 s), ``rest-catalog`` starts a server only ``make test`` installs (``make rest-catalog``, ~10 s of CPU).
SLOW_GROUPS = {"wheel", "rest-catalog"}

# Budgets: seconds of wall time of a group on its worker in a full ``make test`` on a quiet 2-core machine
# (docs/testing.md: the measured profile). xdist hands the groups out in this order, the longest first, then the
# tests of no group (longest-processing-time first: no long group starts last; ``make test`` runs with
# --no-loadscope-reorder). A group not listed gets DEFAULT_BUDGET: add yours when it needs more.
BUDGETS = {
    "tests/cluster/test_cluster_jobs.py": 150,
    "tests/milvus_real/test_mirror.py": 175,
    "tests/chaos/test_driver_kills.py": 50,
    "tests/milvus_real/test_mirror_verify.py": 45,
    "tests/milvus_real_pulsar/test_mirror.py": 30,
    "tests/spark/test_wal26_spark.py": 55,
    "tests/spark/test_source.py": 70,
    "tests/milvus_real/test_mirror_storage.py": 50,
    "tests/chaos/test_soak.py": 80,
    "tests/spark_connect/test_connect.py": 55,
    "tests/milvus_real/test_mirror_history.py": 45,
    "tests/milvus_real/test_milvus_oracle.py": 55,
    "tests/milvus_real/test_mirror_keys.py": 40,
    "tests/jobs/test_jobs.py": 35,
    "tests/jobs/test_mirror_job.py": 100,
    "tests/mirror_job/test_mirror_many.py": 45,
    "tests/chaos/test_worker_kills.py": 35,
    "tests/chaos/test_broker_faults.py": 30,
    "tests/mq_milvus/test_mirror_snapshot.py": 35,
    "tests/mirror_job/test_mirror_many_kills.py": 100,
    "tests/mirror_job/test_mirror_one_ddl.py": 30,
    "tests/mirror_job/test_mirror_many_beside.py": 110,
    "tests/milvus_real/test_mirror_many.py": 80,
    "wheel": 60,
    "rest-catalog": 40,
}
DEFAULT_BUDGET = 30

# Tests of no group that run long (a job or program in a subprocess: a JVM of its own, kills and restarts): their
# seconds on a quiet machine, by node-id prefix (a module: each of its tests), so that xdist hands them out among
# the groups by length instead of after all of them (a 60 s test started last would end the run alone). Any other
# test of no group counts as 0.
LONG_TESTS = {
    "tests/bench/test_bench_scripts.py": 45,
    "tests/jobs/test_jobs.py::test_demo_runs_green_with_small_sizes": 35,
    "tests/jobs/test_jobs.py::test_publish_runs_under_spark_submit": 30,
    "tests/mirror_job/test_mirror_kills.py": 30,
    "tests/packaging/test_autoregistration.py::test_editable_install_from_another_directory": 30,
    "tests/mirror/test_maintenance.py::test_the_maintenance_entry_point": 25,
    "tests/mirror/test_maintenance.py::test_msgstream_mirror_compact_sigkilled_then_rerun": 20,
    "tests/chaos/test_bad_input.py::test_inspect_and_tail_give_one_error_line_per_bad_payload": 20,
}


def xdist_group(item) -> str | None:
    """The worker group of a test (None: any worker)."""
    mark = item.get_closest_marker("xdist_group")  # a test's own (e.g. a parameter that takes a server by name)
    if mark is not None:
        return mark.args[0] if mark.args else mark.kwargs["name"]
    names = getattr(item, "fixturenames", ())
    for fixture, group in SHARED_DIRECTORY.items():
        if fixture in names:
            return group
    if any(f in names for f in PROCESS_FIXTURES):
        return item.nodeid.split("::", 1)[0]
    for fixture, group in SHARED_SERVERS.items():
        if fixture in names:
            return group
    return None


def budget(group: str | None) -> float:
    """A group's budget in seconds (0: no group)."""
    return 0.0 if group is None else BUDGETS.get(group, DEFAULT_BUDGET)


def expected_seconds(nodeid: str, group: str | None) -> float:
    """What a test's scope (its group, or the test alone) is expected to take: the order xdist hands it out in."""
    if group is not None:
        return budget(group)
    return max((s for prefix, s in LONG_TESTS.items() if nodeid.startswith(prefix)), default=0.0)


# tryfirst: xdist's worker reads the ``xdist_group`` marks in its own pytest_collection_modifyitems, which is
# registered after this conftest and so would otherwise run before this one.
@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(items):
    """Every test that starts Spark, or is of a SLOW_GROUPS group, is ``slow`` (``make test-fast`` runs the others);
    groups for xdist, the longest first (budgets; LONG_TESTS for a test of no group; a stable sort: each group
    keeps its order)."""
    order = {}
    for item in items:
        group = xdist_group(item)
        if "spark" in getattr(item, "fixturenames", ()) or group in SLOW_GROUPS:
            item.add_marker(pytest.mark.slow)
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
        order[item.nodeid] = -expected_seconds(item.nodeid, group)
    items.sort(key=lambda it: order[it.nodeid])


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
    from tests.fixtures.suite_profile import BUDGET_KEY  # a plugin (pytest_plugins): imported once registered

    config.stash[BUDGET_KEY] = budget  # the suite profile prints each group's budget beside its wall time
