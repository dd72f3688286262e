"""The time-tick cut planner (stream.ticks): pure functions, no backend, no Spark."""

from __future__ import annotations

from msgstream_spark.stream.ticks import Item, common_tick, plan_cut, split_at, tick_bound


def chan(spec: str, rows: int = 10, size: int = 100) -> list[Item]:
    """'I I T5 I T9' -> items: inserts of ``rows`` rows, ticks with their ts; ids count up."""
    out = []
    for i, tok in enumerate(spec.split()):
        if tok.startswith("T"):
            out.append(Item(i, int(tok[1:]), True, 0, 10))
        else:
            out.append(Item(i, 0, False, rows, size))
    return out


def test_cut_at_the_lowest_tick_every_pending_channel_reached():
    views = {"a": chan("I T5 I T9 I"), "b": chan("I T5 I")}
    taken, rows = plan_cut(views, {"a", "b"}, {})
    assert taken == {"a": 2, "b": 2} and rows == 20  # b is pending after T5: nothing past 5


def test_a_channel_ending_on_a_tick_does_not_hold_the_others_back():
    views = {"a": chan("I T5 I T9"), "b": chan("I T5 I T7 I")}
    assert tick_bound(views, ["a", "b"], {}) == 7
    taken, _ = plan_cut(views, {"a", "b"}, {})
    assert taken == {"a": 2, "b": 4}


def test_no_tick_yet_means_no_progress_on_aligned_channels():
    views = {"a": chan("I I"), "b": chan("I T5")}
    taken, rows = plan_cut(views, {"a", "b"}, {"a": 0, "b": 0})
    assert taken == {"a": 0, "b": 0} and rows == 0


def test_row_budget_picks_the_largest_cut_within_it_but_always_progresses():
    views = {"a": chan("I T1 I T2 I T3 I T4")}
    assert plan_cut(views, {"a"}, {}, max_rows=25)[0] == {"a": 4}
    assert plan_cut(views, {"a"}, {}, max_rows=1)[0] == {"a": 2}  # one step even over budget
    assert plan_cut(views, {"a"}, {}, max_bytes=250)[0] == {"a": 4}


def test_unaligned_channels_share_what_is_left_by_message():
    views = {"a": chan("I T1 I T2"), "u": chan("I I I I"), "v": chan("I I I I")}
    taken, rows = plan_cut(views, {"a"}, {}, max_rows=60)
    assert taken == {"a": 4, "u": 2, "v": 2} and rows == 60
    taken, rows = plan_cut(views, {"a"}, {})
    assert taken == {"a": 4, "u": 4, "v": 4} and rows == 100


def test_tt_stream_helpers():
    class M:
        def __init__(self, end_ts):
            self.end_ts = end_ts

    ms = [M(3), M(8), M(5)]
    take, rest = split_at(ms, 5)
    assert [m.end_ts for m in take] == [3, 5] and [m.end_ts for m in rest] == [8]
    assert common_tick([9, 4, 7]) == 4
