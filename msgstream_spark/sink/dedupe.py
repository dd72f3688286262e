"""Reading side of the sink's exactly-once protocol: drop replayed messages.

Every message the sink writes carries ``msgstream.writer``, ``msgstream.batch``,
``msgstream.task`` and ``msgstream.seq`` properties. For one (writer, task) on one channel
a first write produces strictly increasing ``(batch, seq)``; a retried task (after a crash
between producing and the batch commit) starts again at ``seq`` 0 of the same batch.
So a message whose ``(batch, seq)`` is not above the last one seen for its
(channel, writer, task) is a replay and is dropped. Messages without these properties
(Milvus's own, time ticks) always pass. The state is plain data (picklable).

In the 2.6 format with ``transactional=true`` only the CommitTxn carries these keys (see
``sink/wal.py``): apply the filter in broker order *before* assembling transactions, so a
replayed batch loses its Commit (its bodies expire) and a retry after a killed attempt stays a
first delivery.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

# Message property keys of the exactly-once protocol (consumers ignore unknown keys).
PROP_WRITER = "msgstream.writer"
PROP_BATCH = "msgstream.batch"
PROP_TASK = "msgstream.task"
PROP_SEQ = "msgstream.seq"


def replay_key(properties: Mapping[str, str]) -> tuple[str, str, int, int] | None:
    """(writer, task, batch, seq) of a sink message, or None when it carries no such key."""
    w = properties.get(PROP_WRITER)
    if w is None:
        return None
    try:
        return w, str(properties.get(PROP_TASK, "")), int(properties[PROP_BATCH]), int(properties[PROP_SEQ])
    except (KeyError, ValueError):
        return None


@dataclass
class ReplayFilter:
    """Per channel, the last ``(batch, seq)`` seen for each (writer, task)."""

    last: dict[str, dict[tuple[str, str], tuple[int, int]]] = field(default_factory=dict)
    dropped: int = 0

    def keep(self, channel: str, properties: Mapping[str, str]) -> bool:
        """True for a first delivery; False (and counted) for a replay."""
        key = replay_key(properties)
        if key is None:
            return True
        w, t, b, s = key
        seen = self.last.setdefault(channel, {})
        prev = seen.get((w, t))
        if prev is not None and (b, s) <= prev:
            self.dropped += 1
            return False
        seen[(w, t)] = (b, s)
        return True
