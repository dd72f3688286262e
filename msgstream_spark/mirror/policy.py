"""The maintenance policy of a running mirror: what is kept, and when the job compacts and trims history.

A :class:`MaintenancePolicy` holds the thresholds (documented defaults below and in docs/mirror.md,
"Maintenance policy"), read from ``key=value`` options (``--maintenance compact.small-files=16``).
:func:`due` decides, after each committed batch, which tasks run; :func:`keep_from` decides which of the
table's versions are retained. Spark-free and format-free: the table's figures come in as numbers.

Retention: the versions committed within ``retain.age`` of now are kept, and the version that was current
when that window began (a reader pinned then still reads it), but at least the newest ``retain.min`` and at
most the newest ``retain.max`` versions (``retain.max`` bounds the history a commit reads and writes however
fast the job commits). A reader pinned to a version that is kept reads it; older versions go.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, fields, replace

from msgstream_spark.errors import MirrorError

# key in options -> (attribute, meaning)
KEYS: dict[str, tuple[str, str]] = {
    "enabled": ("enabled", "run maintenance inside the job at all (true/false)"),
    "compact.every": ("compact_every", "compact after every N committed batches (0: only by the thresholds)"),
    "compact.deleted-fraction": ("compact_deleted_fraction",
                                 "compact when the deleted rows reach this fraction of the rows in data files"),
    "compact.small-files": ("compact_small_files",
                            "compact when this many data files are under half of compact.target-mb"),
    "compact.target-mb": ("compact_target_mb", "size of the files a compaction writes, in MiB"),
    "retain.age": ("retain_age_s", "keep the versions current within this duration (s, m, h, d)"),
    "retain.min": ("retain_min", "keep at least this many of the newest versions"),
    "retain.max": ("retain_max", "keep at most this many of the newest versions"),
    "expire.every": ("expire_every", "trim the history (expire versions, their log and files) every N batches"),
    "manifests.max": ("manifests_max", "Iceberg: merge the current snapshot's manifests when it lists more"),
}


@dataclass(frozen=True)
class MaintenancePolicy:
    """What the job's maintenance does, and when (defaults: docs/mirror.md, "Maintenance policy")."""

    enabled: bool = True
    compact_every: int = 0
    compact_deleted_fraction: float = 0.10
    compact_small_files: int = 32
    compact_target_mb: int = 256
    retain_age_s: float = 3600.0
    retain_min: int = 10
    retain_max: int = 100
    expire_every: int = 10
    manifests_max: int = 100

    def __post_init__(self) -> None:
        if self.retain_min < 1 or self.retain_max < self.retain_min:
            raise MirrorError(f"maintenance: retain.min ({self.retain_min}) must be >= 1 and retain.max "
                              f"({self.retain_max}) >= retain.min (--maintenance)")
        for name in ("compact_every", "compact_small_files", "expire_every", "manifests_max"):
            if getattr(self, name) < 0:
                raise MirrorError(f"maintenance: {_key_of(name)} must be >= 0, got {getattr(self, name)}")
        if self.compact_target_mb < 1 or self.retain_age_s < 0 or self.compact_deleted_fraction < 0:
            raise MirrorError("maintenance: compact.target-mb must be >= 1, retain.age and "
                              "compact.deleted-fraction >= 0 (--maintenance)")

    @property
    def target_bytes(self) -> int:
        return self.compact_target_mb << 20

    def as_options(self) -> dict[str, str]:
        """The policy as ``key=value`` options (what the job logs and ``mirror status`` shows)."""
        return {k: _text(getattr(self, attr)) for k, (attr, _) in KEYS.items()}


def _key_of(attr: str) -> str:
    return next(k for k, (a, _) in KEYS.items() if a == attr)


def _text(v: object) -> str:
    return str(v).lower() if isinstance(v, bool) else str(v)


_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def seconds(text: str) -> float:
    """A duration: ``90``, ``90s``, ``15m``, ``1h``, ``7d`` (seconds without a unit)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smhd]?)\s*", text.lower())
    if m is None:
        raise ValueError(f"not a duration: {text!r} (e.g. 90s, 15m, 1h, 7d)")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


def parse(options: list[str] | dict[str, str] | None, base: MaintenancePolicy | None = None) -> MaintenancePolicy:
    """``base`` (default: the defaults) with ``key=value`` options applied; MirrorError naming a wrong key or
    value."""
    pairs = options.items() if isinstance(options, dict) else (_split(o) for o in options or [])
    types = {f.name: f.type for f in fields(MaintenancePolicy)}
    changes: dict[str, object] = {}
    for key, value in pairs:
        if key not in KEYS:
            raise MirrorError(f"--maintenance {key}={value}: unknown key; the keys: {', '.join(KEYS)}")
        attr = KEYS[key][0]
        try:
            changes[attr] = _value(attr, types[attr], value)
        except ValueError as e:
            raise MirrorError(f"--maintenance {key}={value}: {e}") from e
    return replace(base or MaintenancePolicy(), **changes)


def _split(option: str) -> tuple[str, str]:
    key, eq, value = option.partition("=")
    if not eq:
        raise MirrorError(f"--maintenance {option!r}: expected key=value; the keys: {', '.join(KEYS)}")
    return key.strip(), value.strip()


def _value(attr: str, kind: str, value: str) -> object:
    if attr == "retain_age_s":
        return seconds(value)
    if kind == "bool":
        if value.lower() not in ("true", "false", "1", "0", "yes", "no", "on", "off"):
            raise ValueError("expected true or false")
        return value.lower() in ("true", "1", "yes", "on")
    return int(value) if kind == "int" else float(value)


@dataclass
class TableFigures:
    """What the policy decides on: the table's live data files now, and the batches since each task ran."""

    files: int = 0
    small_files: int = 0
    rows: int = 0  # rows in the live data files, deleted ones included
    deleted_rows: int = 0
    manifests: int = 0  # Iceberg: manifests the current snapshot lists (0: not known / another format)
    batches_since_compaction: int = 0
    batches_since_expiry: int = 0


def due(policy: MaintenancePolicy, f: TableFigures) -> list[str]:
    """The tasks to run now, in order: ``compact``, ``merge_manifests``, ``expire``; why each is due is
    :func:`reasons`'."""
    return [task for task, _ in reasons(policy, f)]


def reasons(policy: MaintenancePolicy, f: TableFigures) -> list[tuple[str, str]]:
    """(task, why) for each task due."""
    if not policy.enabled:
        return []
    out = []
    why = _compaction_reason(policy, f)
    if why:
        out.append(("compact", why))
    if policy.manifests_max and f.manifests > policy.manifests_max:
        out.append(("merge_manifests", f"{f.manifests} manifests > manifests.max {policy.manifests_max}"))
    if policy.expire_every and f.batches_since_expiry >= policy.expire_every:
        out.append(("expire", f"{f.batches_since_expiry} batches since the last expiry"))
    return out


def _compaction_reason(policy: MaintenancePolicy, f: TableFigures) -> str | None:
    if policy.compact_every and f.batches_since_compaction >= policy.compact_every:
        return f"{f.batches_since_compaction} batches (compact.every {policy.compact_every})"
    if f.rows and f.deleted_rows and f.deleted_rows >= policy.compact_deleted_fraction * f.rows:
        return f"{f.deleted_rows} of {f.rows} rows deleted (compact.deleted-fraction {policy.compact_deleted_fraction})"
    if policy.compact_small_files and f.small_files >= policy.compact_small_files:
        return f"{f.small_files} small files (compact.small-files {policy.compact_small_files})"
    return None


def keep_from(policy: MaintenancePolicy, versions: list[tuple[int, int]], now_ms: int) -> int:
    """The index in ``versions`` ((version, committed ms), oldest first) of the oldest version kept."""
    n = len(versions)
    if n == 0:
        return 0
    cutoff = now_ms - int(policy.retain_age_s * 1000)
    first = n - 1  # the version current when the window began: the newest committed at or before it
    while first > 0 and versions[first][1] > cutoff:
        first -= 1
    first = min(first, n - policy.retain_min)  # at least retain.min
    return max(first, n - policy.retain_max, 0)  # at most retain.max
