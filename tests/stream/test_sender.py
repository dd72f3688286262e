"""The per-channel sender and close-everything (stream.sender): pure functions over callables."""

from __future__ import annotations

import threading

import pytest

from msgstream_spark.errors import ProduceError
from msgstream_spark.stream.sender import close_all, send_per_channel


def test_each_channel_gets_its_batch_in_order_and_channels_run_in_parallel():
    seen: dict[str, list[int]] = {}
    barrier = threading.Barrier(3, timeout=10)  # all three channels must be in flight at once

    def send(ch, batch):
        barrier.wait()
        seen[ch] = list(batch)
        return [f"{ch}:{i}" for i in batch]

    out = send_per_channel({"a": [1, 2], "b": [3], "c": [4, 5, 6]}, send)
    assert seen == {"a": [1, 2], "b": [3], "c": [4, 5, 6]}
    assert out["c"] == ["c:4", "c:5", "c:6"]


def test_failures_name_every_failed_channel_and_keep_what_was_written():
    def send(ch, batch):
        if ch != "ok":
            raise ProduceError(f"{ch} is down", channel=ch, failures=[(0, "down")])
        return ["id"]

    with pytest.raises(ProduceError, match=r"channel\(s\) bad1, bad2") as info:
        send_per_channel({"bad1": [1], "ok": [2], "bad2": [3]}, send)
    assert info.value.results == {"ok": ["id"]} and info.value.channel == "bad1"
    assert isinstance(info.value.__cause__, ProduceError)


def test_close_all_closes_everything_and_returns_the_first_error():
    closed = []

    class Res:
        def __init__(self, name, fail=False):
            self.name, self.fail = name, fail

        def close(self):
            closed.append(self.name)
            if self.fail:
                raise RuntimeError(self.name)

    first = close_all([Res("p1", fail=True), Res("p2"), Res("c1", fail=True)], lambda: closed.append("client"))
    assert closed == ["p1", "p2", "c1", "client"] and str(first) == "p1"
    assert close_all([Res("x")]) is None
