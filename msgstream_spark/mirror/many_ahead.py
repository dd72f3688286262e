"""A restarted database job's tables opened, their writer leases taken, then their live files read ahead, in a
thread of its own while Spark starts the query (issue #44: a restart's 20 Iceberg tables cost ~10 ms of catalog
work each to open, a few ms each to take the lease, ~10-20 ms each to read their manifests; the query's start is
mostly the JVM's, so the driver's Python is free meanwhile).

The first use of the tables (the first batch, the job's summary) waits until every table is open and gets an
error opening one raised there, as the job's start would have raised it. A lease not taken ahead (another
writer holds it) is only logged: the table's first batch takes it or fails as it always did. The read ahead
(``warm``: a format's live files read into the table object's caches) stops when the first batch begins, after
the table it is reading: no table is read by two threads.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

THREAD_NAME = "mirror-warm-up"
WAIT_STEP_S = 1.0  # how often a wait for the tables looks whether the thread is still alive


class Ahead:
    """``opened()`` (the tables an earlier run made, by collection id) run into ``into``, then ``take(cid, m)``
    (each table's lease) and each table's ``warm`` (if its format has one), in one daemon thread started at once."""

    def __init__(self, opened: Callable[[], dict[int, Any]], into: dict[int, Any],
                 take: Callable[[int, Any], Any] | None = None) -> None:
        self.error: BaseException | None = None
        self._opened = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(opened, into, take), name=THREAD_NAME, daemon=True)
        self._thread.start()

    def _run(self, opened: Callable[[], dict[int, Any]], into: dict[int, Any], take) -> None:
        try:
            into.update(opened())
        except BaseException as e:  # noqa: BLE001 - raised where the tables are first used (wait_opened)
            self.error = e
            return
        finally:
            self._opened.set()
        for cid, m in list(into.items()) if take is not None else ():
            if self._stop.is_set():
                return
            try:
                take(cid, m)
            except Exception as e:  # noqa: BLE001 - its first batch takes it (or fails, naming the holder)
                log.info("table %s: its writer lease not taken ahead: %s", m.table.location, e)
        for m in list(into.values()):
            if self._stop.is_set():
                return
            if hasattr(m.table, "warm"):
                try:
                    m.table.warm()
                except Exception as e:  # noqa: BLE001 - only a read ahead: the batch reads the table itself
                    log.warning("table %s: its live files not read ahead: %s", m.table.location, e)

    def wait_opened(self) -> None:
        """Once every table is open (the error opening one raised here, at each call)."""
        while not self._opened.wait(WAIT_STEP_S):
            if not self._thread.is_alive():  # (it sets the event on every way out: not reached)
                break
        if self.error is not None:
            raise self.error

    def stop(self) -> None:
        """The read ahead stopped after the table it is reading (the tables opened first); the thread joined."""
        self._stop.set()
        self._thread.join()
