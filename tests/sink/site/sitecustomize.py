"""Loaded by every Python process started with this directory on PYTHONPATH (Spark's workers
of the exactly-once test's query): installs the kill-after-produce failpoint when asked."""

import os

if os.environ.get("MSGSTREAM_TEST_KILL_AFTER_PRODUCE"):
    from tests.sink.failpoint import ENV, install

    install(os.environ[ENV])
