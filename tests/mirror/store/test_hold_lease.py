"""``store.writer.hold_lease``: a table's lease held by a job across threads (the database job holds each table's
from its first batch to its end): no thread holds it, a thread handed it joins, a thread not handed it is refused
as a second writer, and its release (from any thread, once) frees it for the next writer."""

from __future__ import annotations

import json
import threading

import pytest

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.store import open_store
from msgstream_spark.mirror.store.lease import LEASE_NAME
from msgstream_spark.mirror.store.writer import hold_lease, writer_lock


def _on_thread(fn):
    out: dict = {}

    def run():
        try:
            out["value"] = fn()
        except Exception as e:  # noqa: BLE001 - handed back to the test
            out["error"] = e

    t = threading.Thread(target=run)
    t.start()
    t.join(30)
    assert not t.is_alive()
    return out


def test_a_held_lease_is_joined_when_handed_refused_otherwise_and_freed_by_its_release(tmp_path):
    loc = str(tmp_path / "t")
    (tmp_path / "t").mkdir()
    (tmp_path / "t" / "data.parquet").write_bytes(b"x")  # a table's location (not only the lease)
    store = open_store(loc)
    hold, release = hold_lease(store, loc, "the database mirror job")
    assert hold.threads == {}  # the job's, no thread's
    with pytest.raises(MirrorError, match="another thread of this process"):
        with writer_lock(store, loc, "a compaction"):  # this thread, not handed it
            pass
    joined = _on_thread(lambda: _join(store, loc, hold))
    assert joined.get("value") is hold, joined
    assert hold.threads == {}
    done = _on_thread(release)  # released from another thread than the one that took it
    assert "error" not in done, done
    release()  # once: a second call does nothing
    rec = json.loads((tmp_path / "t" / LEASE_NAME).read_text())
    assert rec["expires"] == 0 and rec["epoch"] == 1, rec
    with writer_lock(store, loc, "the next writer") as h:  # free at once
        assert h.epoch == 2


def _join(store, loc, hold):
    with writer_lock(store, loc, "batch 3", share=hold) as h:
        return h
