"""A real Milvus 2.3.5 on pulsar-lite, once for this directory's tests: tests/milvus_real's checks on Pulsar.

``milvus_stack`` here is Milvus writing to pulsar-lite through the Pulsar shim (tests/milvus_real/stack.py);
the tests of tests/milvus_real imported into this directory's modules run against it unchanged. Package
scope in a directory of its own: the Kafka stack of tests/milvus_real is torn down when that package's
tests end, before this one starts, so one xdist worker (group ``milvus-real``, tests/conftest.py) never
runs two Milvus servers at once. ``MSGSTREAM_SKIP_MILVUS=1`` skips it as it skips tests/milvus_real.
"""

from __future__ import annotations

import os

import pytest

from tests.milvus_real.conftest import _milvus_log_on_failure, pymilvus_orm, pytest_runtest_makereport  # noqa: F401
from tests.milvus_real.stack import pulsar_stack


@pytest.fixture(scope="package")
def milvus_stack():
    if os.environ.get("MSGSTREAM_SKIP_MILVUS"):
        pytest.skip("MSGSTREAM_SKIP_MILVUS is set")
    with pulsar_stack() as stack:
        yield stack
