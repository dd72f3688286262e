"""A real Milvus 2.3.5 on pulsar-lite, once for each test module of this directory: tests/milvus_real's checks on
Pulsar.

``milvus_stack`` here is Milvus writing to pulsar-lite through the Pulsar shim (tests/milvus_real/stack.py);
the tests of tests/milvus_real imported into this directory's modules run against it unchanged. Module-scoped
like the Kafka one (tests/milvus_real/conftest.py says why), so an xdist worker runs one Milvus at a time.
``MSGSTREAM_SKIP_MILVUS=1`` skips it as it skips tests/milvus_real.
"""

from __future__ import annotations

import os

import pytest

from tests.milvus_real.conftest import (  # noqa: F401 - the same fixtures and hook on this directory's server
    _a_test_drops_its_collections,
    _milvus_log_on_failure,
    pymilvus_orm,
    pytest_runtest_makereport,
)
from tests.milvus_real.stack import pulsar_stack


@pytest.fixture(scope="module")
def milvus_stack():
    if os.environ.get("MSGSTREAM_SKIP_MILVUS"):
        pytest.skip("MSGSTREAM_SKIP_MILVUS is set")
    with pulsar_stack() as stack:
        yield stack
