"""What schema inference has read, remembered in the backend, so the next plan reads only what came after.

Inference (``source/schema.py``) reads the channels from their first message. Without this, planning a
read costs a fetch of the whole retained log on the driver: a Milvus channel keeps days of it. The state
of a finished scan - each channel's last scanned id and what the scan noted (schemas, creation times,
2.6 broadcasts counted) - is stored under one metadata key per (collection option, channel list)
(``Client.put_metadata``); the next scan with the same key resumes each channel after its id, so its
cost follows what was appended since, not the log's length. The notes are the same as one scan from the
start would make: the same messages are fed, in the same per-channel order (appended messages of
an earlier channel come after older ones of a later channel, as the scan reads channel by channel).

A stored id past a channel's latest (the channel was deleted and re-created) discards the state. A
backend that cannot store or read metadata (a read-only one) only loses the saving: the scan then
starts from the first message, as without this module, and says why in the log.
"""

from __future__ import annotations

import base64
import hashlib
import json
import logging
from dataclasses import dataclass, field
from typing import Any

from msgstream_spark.errors import MsgStreamError
from msgstream_spark.msg.pb import schema_pb2

log = logging.getLogger(__name__)

KEY_PREFIX = "msgstream.schemascan."
VERSION = 1


@dataclass
class ScanState:
    """A scan's notes and where each channel's scan stopped (serialized ids)."""

    found: dict[int, tuple[Any, str]] = field(default_factory=dict)  # cid -> (CollectionSchema, source)
    created: dict[int, int] = field(default_factory=dict)
    broadcasts: set = field(default_factory=set)
    upto: dict[str, bytes] = field(default_factory=dict)

    def to_json(self) -> str:
        return json.dumps({
            "v": VERSION,
            "found": {str(c): [base64.b64encode(s.SerializeToString()).decode(), src] for c, (s, src) in
                      self.found.items()},
            "created": {str(c): t for c, t in self.created.items()},
            "broadcasts": sorted([list(k) for k in self.broadcasts if k is not None], key=repr),
            "upto": {ch: base64.b64encode(i).decode() for ch, i in self.upto.items()}})

    @classmethod
    def from_json(cls, text: str) -> ScanState | None:
        d = json.loads(text)
        if d.get("v") != VERSION:
            return None
        found = {}
        for c, (raw, src) in d["found"].items():
            s = schema_pb2.CollectionSchema()
            s.ParseFromString(base64.b64decode(raw))
            found[int(c)] = (s, src)
        return cls(found, {int(c): int(t) for c, t in d["created"].items()},
                   {tuple(k) for k in d["broadcasts"]},
                   {ch: base64.b64decode(i) for ch, i in d["upto"].items()})


def state_key(collection: str | None, channels: list[str]) -> str:
    """One key per query shape: the collection option and the channel list (hashed: keys stay short)."""
    digest = hashlib.sha256(json.dumps([collection, channels]).encode()).hexdigest()[:32]
    return KEY_PREFIX + digest


def load(client: Any, key: str) -> ScanState:
    """The stored state, or an empty one (nothing stored, a state of another format, or no metadata)."""
    try:
        text = client.get_metadata(key)
    except MsgStreamError as exc:
        log.warning("schema inference reads the channels from their start: the backend's metadata (%s) cannot "
                    "be read: %s", key, exc)
        return ScanState()
    if not text:
        return ScanState()
    try:
        return ScanState.from_json(text) or ScanState()
    except (ValueError, KeyError, TypeError) as exc:
        log.warning("schema inference reads the channels from their start: stored scan state %s is not "
                    "readable (%s)", key, exc)
        return ScanState()


def save(client: Any, key: str, state: ScanState) -> None:
    """Store ``state`` (a backend that cannot store metadata: logged, the next scan reads from the start)."""
    try:
        client.put_metadata(key, state.to_json())
    except MsgStreamError as exc:
        log.warning("schema inference could not store its scan state (%s); the next plan reads the channels "
                    "from their start again: %s", key, exc)
