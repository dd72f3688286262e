"""Iceberg snapshots pyiceberg does not produce itself: data files and position-delete files added in one
snapshot (merge-on-read), and data files with their delete files replaced (compaction).

pyiceberg 0.12 reads position deletes but writes only data manifests (mirror-scale-notes.md); this builds on
its snapshot producer (``pyiceberg.table.update.snapshot._SnapshotProducer``: manifest list, summary, the
catalog commit) and adds a delete manifest (``content = deletes``) next to the data manifest. A position
delete file is a Parquet file of ``file_path`` (field id 2147483546) and ``pos`` (2147483545) sorted by
both (Iceberg spec, "Position Delete Files"). The private API is pinned by ``pyiceberg>=0.12,<0.13``.

Every snapshot made here is fenced at the snapshot it was planned on (``base``, by default the head when the
transaction began): pyiceberg retries a commit the catalog refused by rebasing the snapshot onto the new head,
which for a merge-on-read commit means position deletes naming files another writer (a compaction) removed.
Our producer refuses instead (``_validate_concurrency``, which pyiceberg calls on every retry).
"""

from __future__ import annotations

import os
import uuid
from contextlib import contextmanager

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.write.layout import NO_SNAPSHOT, fence_message, write_data_file

FILE_PATH_ID = 2147483546
POS_ID = 2147483545
DELETE_SCHEMA = pa.schema([
    pa.field("file_path", pa.string(), False, metadata={b"PARQUET:field_id": str(FILE_PATH_ID).encode()}),
    pa.field("pos", pa.int64(), False, metadata={b"PARQUET:field_id": str(POS_ID).encode()}),
])


def write_position_deletes(data_dir: str, deletes: dict[str, np.ndarray]) -> str:
    """One position-delete file holding ``deletes`` (data file path -> positions), sorted by path and position."""
    paths, pos = [], []
    for p in sorted(deletes):
        v = np.sort(np.asarray(deletes[p], dtype=np.int64))
        paths += [p] * len(v)
        pos.append(v)
    out = os.path.join(data_dir, f"delete-{uuid.uuid4().hex}.parquet")
    os.makedirs(data_dir, exist_ok=True)
    write_data_file(pa.Table.from_arrays([pa.array(paths, pa.string()), pa.array(np.concatenate(pos))],
                                         schema=DELETE_SCHEMA), out)
    return out


def delete_data_file(path: str, spec_id: int, partition):
    """The manifest's DataFile of a position-delete file (row count, size, the bounds of the paths it names)."""
    from pyiceberg.manifest import DataFile, DataFileContent, FileFormat

    meta = pq.read_metadata(path)
    col = pq.read_table(path, columns=["file_path"]).column(0)
    lo, hi = min(col.to_pylist()), max(col.to_pylist())
    return DataFile.from_args(
        content=DataFileContent.POSITION_DELETES, file_path=path, file_format=FileFormat.PARQUET, partition=partition,
        record_count=meta.num_rows, file_size_in_bytes=os.path.getsize(path), spec_id=spec_id,
        lower_bounds={FILE_PATH_ID: lo.encode()}, upper_bounds={FILE_PATH_ID: hi.encode()},
        column_sizes={}, value_counts={}, null_value_counts={}, nan_value_counts={}, split_offsets=None,
        sort_order_id=None, equality_ids=None, key_metadata=None)


def data_data_file(tbl, path: str):
    """The manifest's DataFile of a data file a task wrote with the table's field ids (stats from its footer)."""
    from pyiceberg.io.pyarrow import parquet_file_to_data_file

    return parquet_file_to_data_file(tbl.io, tbl.metadata, path)


def head_id(metadata) -> int:
    """The snapshot id at the head of the main branch of table ``metadata`` (``NO_SNAPSHOT``: none)."""
    snap = metadata.current_snapshot()
    return NO_SNAPSHOT if snap is None else snap.snapshot_id


@contextmanager
def fenced(location: str, what: str):
    """Run an Iceberg transaction's commit: MirrorError (nothing committed) when the table moved since it was
    planned or the catalog refused it."""
    from pyiceberg.exceptions import CommitFailedException, ValidationException

    try:
        yield
    except ValidationException as e:
        raise MirrorError(str(e) if "moved from snapshot" in str(e) else
                          f"table {location}: {what} conflicts with another writer's commit ({e}); nothing committed"
                          ) from e
    except CommitFailedException as e:
        raise MirrorError(f"table {location}: the catalog refused {what} ({e}): another writer committed meanwhile; "
                          "nothing committed") from e


def commit_files(tx, tbl, *, adds: list, removes: set[str], properties: dict[str, str], base: int | None = None,
                 operation=None, what: str = "the commit") -> None:
    """One snapshot in transaction ``tx``: the DataFiles ``adds`` (data and position-delete files) added, the
    files whose paths are in ``removes`` (data or delete files) removed; based on snapshot ``base`` (default:
    the transaction's head now), refused if the table is not there or moves before the catalog commit.
    ``operation``: the snapshot's (default: append, or overwrite when it removes or deletes rows)."""
    from pyiceberg.table.snapshots import Operation

    if operation is None:
        operation = Operation.OVERWRITE if removes or any(f.content != 0 for f in adds) else Operation.APPEND
    p = _producer_type()(operation, tx, tbl.io, snapshot_properties=dict(properties))
    p.adds, p.removes, p.what = adds, removes, what
    p.want = head_id(tx.table_metadata) if base is None else base
    p.location = tbl.location().removeprefix("file://")
    p._validate_concurrency()  # the transaction's head is the planned snapshot: else refused before writing
    for f in adds:
        p.append_data_file(f)
    with p:
        pass


_TYPES: dict[str, type] = {}


def _producer_type() -> type:
    """Our snapshot producer (pyiceberg's, imported when first needed): its new manifests (data and deletes),
    the parent's manifests carried (``_carried``), fenced at ``want``, a ``replace`` summed up."""
    if "producer" in _TYPES:
        return _TYPES["producer"]
    from pyiceberg.exceptions import ValidationException
    from pyiceberg.manifest import ManifestContent, ManifestEntry, ManifestEntryStatus
    from pyiceberg.table.snapshots import Operation, Summary
    from pyiceberg.table.update.snapshot import _SnapshotProducer

    class Producer(_SnapshotProducer):  # commit_files sets adds, removes, want, what, location
        def _validate_concurrency(self) -> None:
            """Based on ``want`` or refused (never rebased onto another writer's snapshot by a retry)."""
            got = NO_SNAPSHOT if self._parent_snapshot_id is None else self._parent_snapshot_id
            if got != self.want:
                raise ValidationException(fence_message(self.location, "snapshot", self.want, got, self.what))

        def _summary(self, snapshot_properties=None):
            """pyiceberg sums up append, overwrite and delete only: a replace's totals are an overwrite's."""
            if self._operation != Operation.REPLACE:
                return super()._summary(snapshot_properties or {})
            self._operation = Operation.OVERWRITE
            try:
                s = super()._summary(snapshot_properties or {})
            finally:
                self._operation = Operation.REPLACE
            return Summary(Operation.REPLACE, **s.additional_properties)

        def _deleted_entries(self) -> list:
            return []

        def _existing_manifests(self) -> list:
            return []

        def _writer(self, content):
            spec = self._transaction.table_metadata.spec()
            if content == ManifestContent.DELETES:
                return _delete_writer_type()(spec, self.schema(), self.new_manifest_output(), self._snapshot_id,
                                             self._compression)
            return self.new_manifest_writer(spec)

        def _manifests(self) -> list:
            out = []
            for content in (ManifestContent.DATA, ManifestContent.DELETES):
                new = [f for f in self.adds if (f.content == 0) == (content == ManifestContent.DATA)]
                if new:
                    with self._writer(content) as w:
                        for f in new:
                            w.add(ManifestEntry.from_args(
                                status=ManifestEntryStatus.ADDED, snapshot_id=self._snapshot_id,
                                sequence_number=None, file_sequence_number=None, data_file=f))
                    out.append(w.to_manifest_file())
            return out + _carried(self, self.removes)

    _TYPES["producer"] = Producer
    return Producer


def _delete_writer_type() -> type:
    """A manifest writer of ``content = deletes`` (pyiceberg writes data manifests only)."""
    if "deletes" in _TYPES:
        return _TYPES["deletes"]
    from pyiceberg.manifest import ManifestContent, ManifestWriterV2

    class DeleteManifestWriter(ManifestWriterV2):
        def content(self) -> ManifestContent:
            return ManifestContent.DELETES

        @property
        def _meta(self) -> dict[str, str]:
            return {**super()._meta, "content": "deletes"}

    _TYPES["deletes"] = DeleteManifestWriter
    return DeleteManifestWriter


def _carried(producer, removes: set[str]) -> list:
    """The parent snapshot's manifests for the new snapshot: as they are, or rewritten without the entries of
    ``removes`` (marked deleted)."""
    from pyiceberg.manifest import ManifestEntry, ManifestEntryStatus

    self = producer
    out: list = []
    parent = self._transaction.table_metadata.snapshot_by_id(self._parent_snapshot_id) \
        if self._parent_snapshot_id is not None else None
    for m in parent.manifests(io=self._io) if parent is not None else []:
        if not removes:
            out.append(m)
            continue
        entries = m.fetch_manifest_entry(io=self._io, discard_deleted=True)
        if not any(e.data_file.file_path in removes for e in entries):
            out.append(m)
            continue
        kept = [e for e in entries if e.data_file.file_path not in removes]
        gone = [e for e in entries if e.data_file.file_path in removes]
        self._deleted_data_files.update(e.data_file for e in gone)
        with self._writer(m.content) as w:
            for e in kept:
                w.add_entry(ManifestEntry.from_args(
                    status=ManifestEntryStatus.EXISTING, snapshot_id=e.snapshot_id,
                    sequence_number=e.sequence_number, file_sequence_number=e.file_sequence_number,
                    data_file=e.data_file))
            for e in gone:
                w.add_entry(ManifestEntry.from_args(
                    status=ManifestEntryStatus.DELETED, snapshot_id=self._snapshot_id,
                    sequence_number=e.sequence_number, file_sequence_number=e.file_sequence_number,
                    data_file=e.data_file))
        out.append(w.to_manifest_file())
    return out
