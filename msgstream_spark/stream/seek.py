"""Milvus's seek filter, the one copy every reader uses (wire doc §7.5).

Resuming from a ``MsgPosition`` starts AT its msgID (inclusive) and then drops every
message whose BeginTs is at or before the position's timestamp, until the first time tick
whose timestamp is >= it; that tick is dropped too and everything after it is kept. The
library's ``TtMsgStream``, the Spark source's read tasks and ``msgstream tail --from`` all
decide with :class:`SeekFilter`, so they keep exactly the same messages.

A read that *ends* at a position holds exactly what a resume from that position drops
(:class:`EndFilter`, the same rule seen from the other side), so consecutive ranges between
positions give every message once.
"""

from __future__ import annotations


class SeekFilter:
    """Per-channel state of one seek: ``keep(is_tick, ts)`` for each message in order.

    ``ts`` is the message's BeginTs (a time tick's own timestamp). A filter built with
    ``None`` keeps everything (no seek, or a start after a batch end). BeginTs costs a pass over
    an insert's row timestamps, so hot loops test ``active`` before computing it.
    """

    __slots__ = ("ts",)

    def __init__(self, ts: int | None) -> None:
        self.ts = None if ts is None else int(ts)

    @property
    def active(self) -> bool:
        """True while messages can still be dropped."""
        return self.ts is not None

    def keep(self, is_tick: bool, ts: int) -> bool:
        """Whether the next message of the channel survives the seek."""
        if self.ts is None:
            return True
        if is_tick:
            if ts >= self.ts:
                self.ts = None  # the seek ends here; this tick itself is dropped
            return False
        return ts > self.ts

    def __repr__(self) -> str:
        return f"SeekFilter(ts={self.ts})"


BEFORE, AFTER, DONE = "before", "after", "done"


class EndFilter:
    """The end of a read at a position (msgID, ``ts``): :class:`SeekFilter` from the other side.

    ``side(is_tick, ts)`` for each message from the position's msgID on, in order: ``BEFORE`` (a resume
    from the position drops it: it belongs to the read), ``AFTER`` (a resume keeps it: the read leaves it
    out, but older messages may still follow) or ``DONE`` (the time tick at or after ``ts`` that ends the
    seek: nothing older follows, the read ends there). With ``ordered`` the messages come sorted by time,
    without ticks (what Milvus's consumer releases, what the proxy's ``DumpMessages`` sends): the first
    message after ``ts`` is ``DONE``.
    """

    __slots__ = ("_seek", "ordered")

    def __init__(self, ts: int, ordered: bool = False) -> None:
        self._seek = SeekFilter(ts)
        self.ordered = ordered

    def side(self, is_tick: bool, ts: int) -> str:
        if not self._seek.active:
            return DONE
        kept = self._seek.keep(is_tick, ts)
        if not self._seek.active:
            return DONE
        if is_tick or not kept:
            return BEFORE  # a tick below ts carries no rows; readers keep it for their tick state
        return DONE if self.ordered else AFTER

    def __repr__(self) -> str:
        return f"EndFilter(ts={self._seek.ts}, ordered={self.ordered})"
