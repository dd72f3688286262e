"""Fault injection for the sink's exactly-once test, installed by the test, not by an option.

``install(marker)`` adds a hook to ``msgstream_spark.sink.task.AFTER_PRODUCE``: the first task
that finds ``marker`` missing creates it and kills its Python worker right after its rows are
produced (before the closing ticks and the batch commit).
"""

from __future__ import annotations

import logging
import os

from msgstream_spark.sink import task

ENV = "MSGSTREAM_TEST_KILL_AFTER_PRODUCE"
log = logging.getLogger(__name__)


def install(marker: str) -> None:
    def kill_once(writer: task.TaskWriter) -> None:
        try:
            fd = os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
        except FileExistsError:
            return
        os.write(fd, f"killed task {writer.result.task_id} batch {writer.result.batch_id}\n".encode())
        os.close(fd)
        for p in writer._producers.values():
            p.flush(10.0)
        log.error("test failpoint: killing this Python worker after producing")
        os._exit(17)

    task.AFTER_PRODUCE.append(kill_once)
