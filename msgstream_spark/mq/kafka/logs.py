"""librdkafka's log, routed through Python logging with repeats collapsed.

Without a ``logger`` librdkafka prints to stderr itself: a refused connection is retried every
few milliseconds and each retry prints a ``FAIL ... Connection refused`` line, thousands per
minute. With the logger below (given to every client as confluent-kafka's ``logger`` option)
the lines reach the application's logging setup (the CLI's stderr format, the jobs' and Spark
tasks' logs) and a line that repeats is shown once, then again at most once a minute with the
number of repeats left out in between.

confluent-kafka hands log lines to Python from the thread that polls the client (poll, flush,
consume), never from librdkafka's own threads, and only for lines librdkafka decided to emit:
no level check crosses into Python, unlike the Pulsar client's Python logger.
"""

from __future__ import annotations

import logging
import re
import threading
import time
from collections.abc import Callable

LOGGER_NAME = "msgstream_spark.kafka.librdkafka"
_SHAPE = re.compile(r"\([^()]*\)|rdkafka#\w+-\d+")  # "(after 0ms in state CONNECT)", client handle numbers
_MAX_KEYS = 1000
_SETUP = threading.Lock()


class CollapseRepeats(logging.Filter):
    """Pass the first of a run of similar records; suppress the rest for ``every`` seconds, then pass
    one that says how many were suppressed."""

    def __init__(self, every: float = 60.0, clock: Callable[[], float] = time.monotonic) -> None:
        super().__init__()
        self.every = every
        self._clock = clock
        self._seen: dict[tuple[int, str], list] = {}  # key -> [time shown, suppressed since]
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        text = record.getMessage()
        key = (record.levelno, _SHAPE.sub("", _SHAPE.sub("", text)))  # twice: "(..., 1 error(s) suppressed)"
        now = self._clock()
        with self._lock:
            seen = self._seen.get(key)
            if seen is not None and now - seen[0] < self.every:
                seen[1] += 1
                return False
            if len(self._seen) >= _MAX_KEYS:
                self._seen.clear()
            self._seen[key] = [now, 0]
        if seen is not None and seen[1]:
            record.msg, record.args = (f"{text} ({seen[1]} similar message(s) suppressed in the last "
                                       f"{now - seen[0]:.0f}s)"), ()
        return True


def librdkafka_logger() -> logging.Logger:
    """The logger every librdkafka client of this process writes to (repeats collapsed)."""
    logger = logging.getLogger(LOGGER_NAME)
    with _SETUP:
        if not any(isinstance(f, CollapseRepeats) for f in logger.filters):
            logger.addFilter(CollapseRepeats())
    return logger
