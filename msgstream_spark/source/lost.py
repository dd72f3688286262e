"""Whether a stream can still start where it would resume (``--snapshot when_needed``, issue #20).

A resume position is an offset of this source (``{channel: {"msgID", "ts", ...}}``): a Spark
checkpoint's offset (start after ``msgID``) or a snapshot's recorded positions (start at ``msgID``,
Milvus's seek). Each channel's position is checked the way a read would reach it: the backend's own
``seek``, which raises :class:`~msgstream_spark.errors.DataLossError` where retention removed it. The
backend decides what "gone" means (Kafka offsets, the embedded log's removed prefix, Pulsar ledgers).
"""

from __future__ import annotations

import json
from typing import Any

from msgstream_spark.errors import DataLossError
from msgstream_spark.source.offsets import Offset, entry, normalize, parse_json_positions, unb64


def positions_offset(spec: str, channels: list[str], backend: str = "?") -> Offset:
    """The start offset that a ``startingPositions`` JSON (as a snapshot records it) resolves to,
    for the channels it names (``earliest``: an empty msgID; ``latest`` is not a resume position)."""
    out: Offset = {}
    for ch, how in parse_json_positions(spec, channels, backend).items():
        if how == "earliest":
            out[ch] = entry(b"", 0)
        elif how != "latest":
            out[ch] = entry(how.msg_id, how.timestamp, inclusive=True)
    return normalize(out)


def lost_positions(client: Any, offset: Offset) -> dict[str, str]:
    """``{channel: why}`` for each channel whose start in ``offset`` is no longer readable (empty: all are)."""
    lost: dict[str, str] = {}
    for ch, e in sorted(offset.items()):
        raw = unb64(e.get("msgID", ""))
        if not raw:
            continue  # from the channel's start: whatever is retained
        reader = client.reader(ch)
        try:
            reader.seek(client.bytes_to_message_id(raw), inclusive=bool(e.get("inclusive")))
        except DataLossError as exc:
            lost[ch] = f"position {e['msgID']} ({'at' if e.get('inclusive') else 'after'} it): {exc}"
        finally:
            reader.unsubscribe()
    return lost


def checkpoint_offset(text: str) -> Offset:
    """The source offset of a Spark checkpoint's ``offsets/<batch>`` file (``v1``, metadata, the offset)."""
    lines = [ln for ln in text.splitlines() if ln.strip()]
    if len(lines) < 3:
        raise ValueError(f"a Spark offsets file has a version, metadata and one offset per source; got {len(lines)} "
                         "line(s)")
    return normalize(json.loads(lines[2]))
