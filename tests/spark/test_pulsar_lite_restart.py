"""A streaming query on pulsar-lite keeps running through a broker restart (same port, same db) and
writes every row exactly once."""

from __future__ import annotations

import time

import pytest

from tests.fixtures.backend_env import BackendEnv
from tests.fixtures.pulsar_env import pulsar_config
from tests.fixtures.waits import finish
from tests.spark.helpers import Publisher
from tests.spark.test_source import rows_of, stream


def wait_input_rows(query, n: int, timeout: float = 120.0) -> int:
    """Until the query has taken ``n`` rows in (its progress reports; bounded)."""
    deadline = time.monotonic() + timeout
    while True:
        assert query.exception() is None, query.exception()
        got = sum(p["numInputRows"] for p in query.recentProgress)
        if got >= n or time.monotonic() > deadline:
            return got
        time.sleep(0.2)


@pytest.mark.slow
def test_streaming_query_runs_through_a_restart(spark, pulsar_lite_broker, tmp_path):
    b = pulsar_lite_broker
    env = BackendEnv("pulsar", pulsar_config(b.url, b.web_port, requestTimeout=30), extras={"pulsar_lite": b})
    client = env.client()
    pub = Publisher(client, [env.new_channel("dml"), env.new_channel("dml")])
    pub.rounds(2, rows=3)
    out = tmp_path / "out"
    q = stream(spark, env, pub, "across", tmp_path / "chk", out, trigger={"processingTime": "500 milliseconds"},
               startingPositions="earliest")
    try:
        assert wait_input_rows(q, 12) == 12
        pub.close()
        b.restart()
        pub.rounds(2, rows=3)  # new producers, on the restarted broker
        assert wait_input_rows(q, 24) == 24
    finally:
        q.stop()
        pub.close()
        client.close()
    want = sorted((op, pk) for op, pk, _ in pub.published)
    assert rows_of(spark, out) == want  # every row once: none lost, none written twice
    q2 = stream(spark, env, pub, "across", tmp_path / "chk", out)  # a restart of the query continues
    finish(q2, 120, "the restarted query's availableNow run")
    assert rows_of(spark, out) == want
