"""What a table format is, written once: the :class:`MirrorTable` protocol every caller of a table uses, the
types the formats and the write path share (:class:`WriteSpec`, :class:`LiveFile`, :class:`LiveFiles`,
:class:`Plan`, the fence's message), a version pinned for a read (:class:`Pinned`) and a format's entry in the
registry (:class:`Format`, ``formats/registry.py``).

A format commits a plan of added files and deleted positions with a batch record (query id, batch id) and a
fence (the version the plan read, the writer's epoch); it never imports the write path, which imports it.
To add a format: a package beside ``delta/`` and ``iceberg/`` with a table class that satisfies
:class:`MirrorTable`, a pinned reader that satisfies :class:`Pinned`, and a :class:`Format` entry listed in
``formats/registry.py``.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import numpy as np
import pyarrow as pa

from msgstream_spark.mirror.store import Store, store_for

DATA_DIR = "data"  # the table's data files, under its location


@dataclass
class WriteSpec:
    """What a writing task needs (picklable): the table's Arrow schema (Iceberg's carries field ids), its key,
    the directory for new files (a full URI, or an absolute local path), the snapshot timestamp below which
    changes are dropped, and the store's settings as the driver resolved them (a task never reads its own
    environment: :func:`msgstream_spark.mirror.store.store_for`)."""

    schema: pa.Schema
    pk: str
    data_dir: str
    snapshot_ts: int | None = None
    key_type: pa.DataType = field(default_factory=pa.int64)
    split_by: list[str] = field(default_factory=list)  # one file per value of these (a user's identity partition)
    storage: dict[str, str] = field(default_factory=dict, repr=False)  # (secrets: never printed)
    # the format's own step on each data file a writing task closes (None: the file is committed as written):
    # ``finish(store, spec, written, superseded) -> Written``, ``superseded`` the sorted row positions of the file
    # whose key a later change of the same task replaced (the plan deletes them too); the ``Written`` it returns
    # (same path: the name the narrow rows and the plan use) reaches the commit as ``Plan.info``; a finish with
    # ``open(store, spec, path)`` may return the writer of a task's file itself (``ParquetOut``'s methods; None:
    # a Parquet file), whose ``Written`` then reaches ``finish``
    finish: Callable[..., Any] | None = field(default=None, repr=False)
    footers: bool = False  # each data file's Parquet footer shipped with it (the commit reads its statistics)

    def store(self) -> Store:
        """The store the files go to, built from the shipped settings."""
        return store_for(self.data_dir, self.storage)



@dataclass
class LiveFile:
    """A data file of the table as a lookup task reads it: its path, key bounds, deleted positions."""

    path: str
    key_min: object = None
    key_max: object = None
    deleted: np.ndarray = field(default_factory=lambda: np.zeros(0, np.uint64))  # sorted, unique
    num_rows: int = 0
    partition: object = None  # Iceberg: the file's partition record
    size: int = 0  # bytes, as the table's metadata records it (0: unknown)


NO_SNAPSHOT = -1  # the version of an Iceberg table without a snapshot (snapshot ids are never negative)


class LiveFiles(list):
    """A table's live data files (``LiveFile``) and the version they were read at (Delta: the log version;
    Iceberg: the snapshot id, ``NO_SNAPSHOT`` for none): the version a plan made from them is fenced at."""

    def __init__(self, files=(), version: int | None = None) -> None:
        super().__init__(files)
        self.version = version


def fence_message(location: str, unit: str, base: int, current: int, what: str) -> str:
    """The refusal of a commit planned on ``base`` of a table now at ``current`` (``unit``: version, snapshot)."""
    again = ("compact again" if what == "the compaction" else
             "the batch runs again against the table as it is now (on restart; or apply it again)")
    return (f"table {location} moved from {unit} {base}, which {what} was planned on, to {unit} {current} "
            f"(another writer committed meanwhile: a compaction, a repair, another query?): nothing committed; "
            f"{again}")



@dataclass
class Plan:
    """What one batch commits: new data files (with their rows count) and deleted positions per data file,
    and the table version its lookup read (``LiveFiles.version``): the commit is refused when the table moved
    since (None: a plan made without a lookup, committed on whatever version is current)."""

    adds: list[str]
    deletes: dict[str, np.ndarray]
    rows: int  # changes applied
    base: int | None = None
    info: dict[str, tuple[int, str]] = field(default_factory=dict)  # added file -> (size, stats) its writer reported
    footers: dict[str, bytes] = field(default_factory=dict)  # added file -> its footer (``WriteSpec.footers``)

    @property
    def empty(self) -> bool:
        return not self.adds and not self.deletes


@runtime_checkable
class MirrorTable(Protocol):
    """A mirrored collection's table (one writer at a time: ``store.writer``), every member a caller uses."""

    location: str  # as the caller gave it (a path or a URI)
    root: str  # the location as a URI of its store
    collection: str
    pk: str
    collection_id: int | None
    store: Store  # every file of the table is read and written through it

    @property
    def schema(self) -> pa.Schema: ...

    # identity and bookkeeping
    def properties(self) -> dict[str, str]:
        """The table's ``msgstream.*`` properties (collection identity, job metadata)."""

    def set_properties(self, properties: dict[str, str]) -> None:
        """Store ``msgstream.*`` properties (one commit)."""

    def last_batch(self, query_id: str) -> int | None:
        """The largest batch id of ``query_id`` committed to the table (None: none)."""

    def merged_queries(self) -> set[str]:
        """The ids of the queries that merged batches into the table."""

    def evolve(self, new_schema: pa.Schema) -> None:
        """Add the columns of ``new_schema`` the table lacks, as nullable columns."""

    def to_arrow(self, columns: list[str] | None = None) -> pa.Table:
        """The table's live rows (tests, small tables); ``columns``: only these (a projection: the other columns'
        data is not read)."""

    # the write path (write/batch.py, spark/mirror.py)
    def prepare(self, columns: pa.Schema) -> None:
        """Add the collection fields ``columns`` carry that the table lacks (before tasks write files)."""

    def write_spec(self) -> WriteSpec:
        """What a writing task needs (schema, key, data directory, snapshot timestamp, store settings)."""

    def live_files(self) -> LiveFiles:
        """The live data files (key bounds, deleted positions) and the version they were read at."""

    def commit(self, plan: Plan, *, query_id: str, batch_id: int, commit_info: dict[str, str] | None = None,
               epoch: int | None = None) -> bool:
        """Commit ``plan`` as batch ``batch_id`` of ``query_id`` (False: already in the table); MirrorError,
        nothing committed, if the table moved from ``plan.base`` or holds a writer epoch above ``epoch``."""

    def writer_epoch(self) -> int:
        """The highest writer epoch the table holds (0: none)."""

    def publish_epoch(self, epoch: int) -> None:
        """Put ``epoch`` in the table (one commit of its own): writers below it commit nothing after."""

    # snapshots (snapshot/, spark/snapshot.py)
    def add_files(self, paths: list[str], *, properties: dict[str, str]) -> None:
        """Register Parquet files written elsewhere (a snapshot) as the table's rows, with ``properties``."""

    def replace_files(self, paths: list[str], *, properties: dict[str, str]) -> None:
        """Replace all the table's rows by the Parquet files' (a new snapshot), with ``properties``, in one
        commit: a failure before it leaves the table as it was."""

    # maintenance (maintenance.py)
    def swap_files(self, old: list[LiveFile], new: list[str], base: int | None = None,
                   epoch: int | None = None) -> None:
        """Replace data files ``old`` by ``new`` holding their live rows (a compaction), fenced at ``base``."""

    def referenced_files(self) -> set[str]:
        """Every file the table's current version reads."""

    def retained_files(self, retain_s: float, now: float) -> set[str]:
        """Every file a version committed within ``retain_s`` seconds before ``now`` reads."""

    def expire(self, retain_s: float, now: float) -> None:
        """Forget the versions older than the retention (what vacuum may then delete)."""

    def metadata_files(self) -> list[str]:
        """The format's own metadata files (vacuum keeps those the table still names)."""


class Pinned(Protocol):
    """A table read at the version current when it was pinned (later commits are not seen)."""

    version: Any  # the format's version (Delta: log version; Iceberg: snapshot id, None: no snapshot)
    committed_ms: int | None  # when that version was committed
    info: dict[str, str]  # what that version's commit recorded (its ``msgstream.*`` entries)

    def last_batch(self, query_id: str) -> int | None: ...

    def rows_of(self, pk: str, keys: pa.Array, columns: list[str]) -> pa.Table:
        """The ``columns`` of the rows of ``keys`` at this version (a filtered read)."""

    def batches(self, columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
        """Every row at this version, streamed."""


class ChangeLog(Protocol):
    """An append-only log of Parquet files written by tasks (the mirror's change history), in the format
    ``registry.change_log`` chooses: one version per append with an application transaction (exactly once)."""

    location: str
    store: Any  # the log's Store (its files are written and read through it)
    root: str

    def exists(self) -> bool: ...

    def last_batch(self, app: str) -> int | None:
        """The last version of application ``app`` the log holds (None: none, or no log yet)."""

    def ensure(self, schema: pa.Schema, name: str) -> None:
        """Create the log with ``schema``, or add the columns it lacks."""

    def append(self, paths: list[str], app: str, version: int, info: dict[str, str]) -> bool:
        """One version adding ``paths``; False if the log already holds (``app``, ``version``)."""

    def commit_infos(self) -> list[dict]:
        """Every version's commit info, newest first."""

    def to_arrow(self) -> pa.Table: ...


@dataclass(frozen=True)
class Format:
    """A table format as the rest of the code asks of it (``formats/registry.py`` lists them).

    ``open``: the table at a location (``open(location, collection=, pk=, arrow_schema=, create=,
    collection_id=, **options)``); ``stored_properties``: its ``msgstream.*`` properties without opening it as
    a mirror table (``stored_properties(location, **options)``); ``pin``: the table read at its current
    version. ``options`` the format takes of ``catalog_uri``, ``storage_options``, ``catalog``,
    ``catalog_options`` are named in ``takes``. Features: ``history`` (the mirror job's change history can follow
    it), ``partitions`` (the user's identity partitions), ``time_travel`` (a read at an older version),
    ``catalogs`` (the table may be named in a catalog: ``namespace.table``). ``compact``: the format's own
    compaction, None for the mirror's (``compact(table, target_bytes, base, epoch) -> (files in, files out, rows,
    deleted rows)``, fenced at version ``base`` and writer ``epoch``, under the caller's writer lease).
    ``storage_keys``: storage options the format's own library reads beyond object_store's, by kind of store
    (accepted by the store's settings, handed to that library only). ``file_suffixes``: how the names of the
    files the format's own library (or its tasks) write under ``data/`` end: ``orphans`` and ``vacuum`` count
    them with the Parquet files."""

    name: str
    title: str  # for messages: "Delta", "Iceberg"
    table: type
    open: Callable[..., MirrorTable]
    stored_properties: Callable[..., dict[str, str]]
    pin: Callable[[Any], Pinned]
    takes: tuple[str, ...] = ("storage_options",)
    history: bool = False
    partitions: bool = False
    time_travel: bool = True
    catalogs: bool = False
    compact: Callable[..., tuple[int, int, int, int]] | None = None
    storage_keys: Mapping[str, tuple[str, ...]] = field(default_factory=dict)
    file_suffixes: tuple[str, ...] = ()  # the format's own files under data/ (beside Parquet) orphans may count

    @property
    def article(self) -> str:
        """ "a Delta", "an Iceberg" (for messages)."""
        return ("an " if self.title[:1].lower() in "aeiou" else "a ") + self.title
