"""A mirror job's run sets the driver's objects of its start aside from full garbage collections
(``jobs._common.long_lived``, ``gc.freeze``): a full collection in a batch walks only what the run made since. The
run's end gives them back to the collector (garbage among them is collected then); a process that froze objects
itself keeps its own freeze."""

from __future__ import annotations

import gc
import weakref

import pytest

from msgstream_spark.jobs._common import long_lived


class _Cycle:
    def __init__(self) -> None:
        self.me = self


def test_the_objects_of_a_runs_start_are_frozen_until_its_end_and_collected_after():
    assert gc.get_freeze_count() == 0
    old = _Cycle()
    ref = weakref.ref(old)
    with long_lived():
        assert gc.get_freeze_count() > 0
        del old  # garbage frozen with the run's start: not collected during the run
        gc.collect()
        assert ref() is not None
        young = _Cycle()  # made during the run: collected as always
        yref = weakref.ref(young)
        del young
        gc.collect()
        assert yref() is None
    assert gc.get_freeze_count() == 0
    gc.collect()
    assert ref() is None


def test_a_failed_run_unfreezes_and_another_owners_freeze_is_kept():
    with pytest.raises(RuntimeError), long_lived():
        raise RuntimeError("the query failed")
    assert gc.get_freeze_count() == 0
    mine = _Cycle()
    gc.freeze()  # the process's own (a service that froze before forking, say)
    try:
        with long_lived():
            assert not _tracked(mine)  # still in the process's freeze
        assert gc.get_freeze_count() > 0 and not _tracked(mine)  # not unfrozen by the run
    finally:
        gc.unfreeze()
    assert _tracked(mine)


def _tracked(obj) -> bool:
    """Whether ``obj`` is in the collector's generations (a frozen object is not). The freeze's count is no
    measure: a frozen object freed by its reference count leaves it (the suite's other threads free some)."""
    return any(o is obj for o in gc.get_objects())
