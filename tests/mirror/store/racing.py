"""Run calls at the same moment on threads (a barrier releases them together): the racing writers of the store
and lease tests."""

from __future__ import annotations

import threading
from collections.abc import Callable


def race(calls: list[Callable[[], object]], expected: type[BaseException]) -> tuple[list[object], list[BaseException]]:
    """(results of the calls that returned, the ``expected`` errors of those that raised it); any other error
    fails the race."""
    barrier = threading.Barrier(len(calls))
    won: list[object] = []
    lost: list[BaseException] = []
    other: list[BaseException] = []

    def run(call: Callable[[], object]) -> None:
        barrier.wait(timeout=30)
        try:
            won.append(call())
        except expected as e:
            lost.append(e)
        except BaseException as e:  # noqa: BLE001 - reported below
            other.append(e)

    threads = [threading.Thread(target=run, args=(c,)) for c in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not other, other
    assert len(won) + len(lost) == len(calls), "a racer did not finish"
    return won, lost
