"""A real Milvus 2.3.5 on tansu (through the ApiVersions shim), once per xdist worker for this directory's tests.

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


# Session-scoped: a worker starts it for the first module of this directory it runs (tests/conftest.py groups the
# tests by module) and every later one shares it; tests are isolated by collection names, and drop what they
# create (below). Idle, with no collection loaded, the server and tansu take about 1.5 s of CPU a minute; a start
# takes about 6 s of wall time and under a second of CPU.
@pytest.fixture(scope="session")
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


@pytest.fixture(scope="package")
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


def _drop(alias: str, names: set[str]) -> None:
    from pymilvus import utility

    for name in sorted(names):
        utility.drop_collection(name, using=alias)


# Every loaded collection costs the server and its MQ about 1 s of CPU a minute (its channels' consumers; measured
# on tansu: 10 loaded collections 11 s a minute, none 1.4 s), and the suite creates about 20 per server: each test
# drops the collections it created when it ends, each module those its module-scoped fixtures created. Tests are
# isolated by collection names, never by a fresh server. It also means a re-run (make test re-runs a test once
# when Spark timed out on a Python worker) starts without what its failed attempt created (the names are fixed).
@pytest.fixture(scope="module", autouse=True)
def _a_module_drops_its_collections(request):
    mine = [it for it in request.session.items if it.nodeid.startswith(f"{request.node.nodeid}::")]
    if not any("pymilvus_orm" in getattr(it, "fixturenames", ()) for it in mine):
        yield
        return
    alias = request.getfixturevalue("pymilvus_orm")
    before = _collections(alias)
    yield
    _drop(alias, _collections(alias) - before)


@pytest.fixture(autouse=True)
def _a_test_drops_its_collections(request):
    if "pymilvus_orm" not in request.fixturenames:
        yield
        return
    alias = request.getfixturevalue("pymilvus_orm")
    before = _collections(alias)
    yield
    _drop(alias, _collections(alias) - before)
