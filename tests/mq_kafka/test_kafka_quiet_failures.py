"""Kafka failures are quiet and quick: librdkafka's log goes through Python logging with repeats
collapsed, a broker list that refuses connections fails within seconds, a slow broker is still
waited for up to kafka.requestTimeout."""

from __future__ import annotations

import logging
import subprocess
import sys
import time

import pytest

from msgstream_spark.errors import BackendError, BackendUnavailableError
from msgstream_spark.mq.base import ProducerMessage
from msgstream_spark.mq.kafka.client import KafkaClient
from msgstream_spark.mq.kafka.logs import LOGGER_NAME, CollapseRepeats
from tests.fixtures.kafka_env import kafka_config
from tests.fixtures.login_env import login_env
from tests.fixtures.tansu import free_port

REFUSED = "FAIL [rdkafka#producer-1] [thrd:h:1/bootstrap]: h:1/bootstrap: Connect to ipv4#h:1 failed: " \
          "Connection refused (after {n}ms in state CONNECT{more})"


@pytest.mark.slow  # a broker or process fault: waits out real timeouts
def test_cli_on_a_refused_broker_list_prints_one_clear_error(tmp_path):
    broker = f"127.0.0.1:{free_port()}"
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "msgstream_spark.cli.main", "tail", "-c", "x",
                           "--option", "mq.type=kafka", "--option", f"kafka.brokerList={broker}",
                           "--option", "kafka.requestTimeout=120"],
                          capture_output=True, text=True, timeout=110, cwd=tmp_path, env=login_env())
    took = time.monotonic() - t0
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1, proc.stderr
    assert lines[-1].startswith("msgstream tail: error:") and broker in lines[-1] and "refused" in lines[-1]
    assert len(lines) <= 3, proc.stderr  # librdkafka's first FAIL line at most, not one per retry
    assert all(line.startswith("msgstream") for line in lines), proc.stderr  # through logging, not raw stderr
    assert took < 100  # far less than kafka.requestTimeout: it did not wait for the timeout


@pytest.mark.slow  # a broker or process fault: waits out real timeouts
def test_refused_broker_list_fails_fast_with_backend_unavailable(caplog):
    broker = f"127.0.0.1:{free_port()}"
    c = KafkaClient(kafka_config(broker, requestTimeout=120))
    with caplog.at_level(logging.INFO, logger=LOGGER_NAME):
        with pytest.raises(BackendUnavailableError, match=f"kafka.brokerList \\({broker}\\) refused"):
            c.latest_message_id("nowhere")
        with pytest.raises(BackendUnavailableError, match="refused"):
            c.create_producer("nowhere")
    c.close()
    fails = [r for r in caplog.records if r.name == LOGGER_NAME and "Connection refused" in r.getMessage()]
    assert len(fails) <= 4  # one per client handle at most, however often librdkafka retried


@pytest.mark.slow  # a broker or process fault: waits out real timeouts
def test_slow_broker_is_bounded_by_the_request_timeout(kafka_broker):
    c = KafkaClient(kafka_config(kafka_broker.bootstrap, requestTimeout=3, readTimeout=2))
    with c.create_producer("slow") as p:
        p.send(ProducerMessage(b"x"))
    fresh = KafkaClient(kafka_config(kafka_broker.bootstrap, requestTimeout=3, readTimeout=2))
    kafka_broker.pause()  # accepts connections (the kernel does) but never answers
    try:
        t0 = time.monotonic()
        with pytest.raises(BackendError) as ei:
            fresh.latest_message_id("slow")
        assert not isinstance(ei.value, BackendUnavailableError)  # not misreported as refused
        assert time.monotonic() - t0 < 60
    finally:
        kafka_broker.resume()
    assert c.latest_message_id("slow") is not None  # and the broker is fine again
    fresh.close()
    c.close()


def test_collapse_repeats_passes_the_first_and_then_a_count():
    now = [0.0]
    f = CollapseRepeats(every=60, clock=lambda: now[0])

    def rec(msg: str, level: int = logging.ERROR) -> logging.LogRecord:
        return logging.LogRecord(LOGGER_NAME, level, __file__, 1, msg, (), None)

    shown = [r for r in (rec(REFUSED.format(n=i % 3, more=", 1 identical error(s) suppressed" if i % 2 else ""))
                         for i in range(2000)) if f.filter(r)]
    assert len(shown) == 1
    assert f.filter(rec("some other line"))  # a different line is not held back
    assert f.filter(rec(REFUSED.format(n=0, more=""), logging.WARNING))  # nor the same at another level
    now[0] = 61.0
    later = rec(REFUSED.format(n=0, more=""))
    assert f.filter(later) and "1999 similar message(s) suppressed in the last 61s" in later.getMessage()
    assert not f.filter(rec(REFUSED.format(n=5, more="")))
