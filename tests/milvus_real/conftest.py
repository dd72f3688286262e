"""A real Milvus 2.3.5 on tansu (through the ApiVersions shim), once for this directory's tests.

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


# Package-scoped: Milvus (its timers tick every 200 ms) is up only while this directory's tests run.
@pytest.fixture(scope="package")
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


_COLLECTIONS_BEFORE: dict[str, set[str]] = {}  # test id -> the collections Milvus held when its first attempt began


@pytest.fixture(autouse=True)
def _a_rerun_starts_without_what_its_failed_attempt_created(request):
    """``make test`` re-runs a test once when Spark timed out on a Python worker (a loaded machine): the re-run
    must not meet the collections its failed attempt created (the tests use fixed names), so it drops them."""
    if "pymilvus_orm" not in request.fixturenames:
        yield
        return
    from pymilvus import utility

    alias = request.getfixturevalue("pymilvus_orm")
    now = set(utility.list_collections(using=alias))
    first = _COLLECTIONS_BEFORE.setdefault(request.node.nodeid, now)
    if getattr(request.node, "execution_count", 1) > 1:
        for name in sorted(now - first):
            utility.drop_collection(name, using=alias)
    yield
