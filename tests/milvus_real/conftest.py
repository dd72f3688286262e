"""A real Milvus 2.3.5 on tansu (through the ApiVersions shim), once for each test module of this directory.

tests/milvus_real_pulsar runs this directory's checks against Milvus on pulsar-lite: its conftest gives
``milvus_stack`` the other MQ and imports the fixtures and hook below.

Start-up is bounded (``MilvusServer.startup_timeout``); every process started here is stopped by
pid; Milvus's own logs are printed when start-up fails and kept in the report of a failing test.
Set ``MSGSTREAM_SKIP_MILVUS=1`` to skip the module where the wheel cannot be fetched.
"""

from __future__ import annotations

import os
import warnings

import pytest

from tests.milvus_real.stack import ALIAS, kafka_stack


# Module-scoped: a module's tests share one server (isolated by collection names; each test drops what it creates,
# below), and each module is an xdist group of its own (tests/conftest.py), handed to whichever worker is free.
# A start takes ~3 s of wall time and under a second of CPU, a stop nothing (SIGKILL); a server shared by all a
# worker's modules cost more: a read of every DML channel (``channelPattern``) also reads every message the
# earlier modules and 10 minutes of time ticks left there (tests/milvus_real/test_milvus_oracle.py took 76 s of
# CPU after the mirror modules on one server instead of ~30 s on its own).
@pytest.fixture(scope="module")
def milvus_stack():
    if os.environ.get("MSGSTREAM_SKIP_MILVUS"):
        pytest.skip("MSGSTREAM_SKIP_MILVUS is set")
    with kafka_stack() as stack:
        yield stack


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


@pytest.fixture(scope="module")
def pymilvus_orm(milvus_stack):
    """pymilvus's ORM connected to the server (the project's pymilvus drives Milvus 2.3.5)."""
    warnings.filterwarnings("ignore", message=".*ORM-style PyMilvus API.*")
    from pymilvus import connections

    connections.connect(ALIAS, uri=milvus_stack.uri, timeout=30)
    yield ALIAS
    connections.disconnect(ALIAS)


def _collections(alias: str) -> set[str]:
    from pymilvus import utility

    return set(utility.list_collections(using=alias))


# Every loaded collection costs the server and its MQ about 1 s of CPU a minute (its channels' consumers; measured
# on tansu: 10 loaded collections 11 s a minute, none 1.4 s): each test drops the collections it created when it
# ends (a module's server goes with its module, and its module-scoped collections with it). A re-run (make test
# re-runs a test once when Spark timed out on a Python worker) so starts without what its failed attempt created.
@pytest.fixture(autouse=True)
def _a_test_drops_its_collections(request):
    if "pymilvus_orm" not in request.fixturenames:
        yield
        return
    from pymilvus import utility

    alias = request.getfixturevalue("pymilvus_orm")
    before = _collections(alias)
    yield
    for name in sorted(_collections(alias) - before):
        utility.drop_collection(name, using=alias)
