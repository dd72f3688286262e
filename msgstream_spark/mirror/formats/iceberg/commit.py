"""Iceberg snapshots pyiceberg does not produce itself: data files and position-delete files added in one
snapshot (merge-on-read), and data files with their delete files replaced (compaction).

pyiceberg 0.12 reads position deletes but writes only data manifests (mirror-scale-notes.md); this builds on
its snapshot producer (``pyiceberg.table.update.snapshot._SnapshotProducer``: manifest list, summary, the
catalog commit) and adds a delete manifest (``content = deletes``) next to the data manifest (the entries
themselves: ``files.py``). The private API is pinned by ``pyiceberg>=0.12,<0.13``.

Every snapshot made here is fenced at the snapshot it was planned on (``base``, by default the head when the
transaction began): pyiceberg retries a commit the catalog refused by rebasing the snapshot onto the new head,
which for a merge-on-read commit means position deletes naming files another writer (a compaction) removed.
Our producer refuses instead (``_validate_concurrency``, which pyiceberg calls on every retry).
"""

from __future__ import annotations

from contextlib import contextmanager

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.common import PROP_WRITER_EPOCH, check_epoch
from msgstream_spark.mirror.formats.base import NO_SNAPSHOT, fence_message
from msgstream_spark.mirror.formats.iceberg.cached import listed, manifest_output, manifests, transaction
from msgstream_spark.mirror.formats.iceberg.manifest_list import write_list
from msgstream_spark.mirror.formats.iceberg.manifest_read import manifest_entries

EPOCH_TRIES = 10  # commits a writer epoch's publication tries, each refused for another writer's commit


def head_id(metadata) -> int:
    """The snapshot id at the head of the main branch of table ``metadata`` (``NO_SNAPSHOT``: none)."""
    snap = metadata.current_snapshot()
    return NO_SNAPSHOT if snap is None else snap.snapshot_id


@contextmanager
def fenced(location: str, what: str):
    """Run an Iceberg transaction's commit: MirrorError (nothing committed) when the table moved since it was
    planned or the catalog refused it (a lost answer says so: the commit may have landed)."""
    from pyiceberg.exceptions import CommitFailedException, CommitStateUnknownException, RESTError, ValidationException

    try:
        yield
    except CommitStateUnknownException as e:
        raise MirrorError(f"table {location}: the catalog's answer to {what} was lost ({e}): it may or may not have "
                          "landed; the next run reads the table as it is (a batch already in it is skipped)") from e
    except RESTError as e:  # a REST catalog's own rules (e.g. no snapshot expiry by commit)
        raise MirrorError(f"table {location}: the catalog refused {what}: {type(e).__name__}: {e}; nothing "
                          "committed") from e
    except ValidationException as e:
        raise MirrorError(str(e) if "moved from snapshot" in str(e) else
                          f"table {location}: {what} conflicts with another writer's commit ({e}); nothing committed"
                          ) from e
    except CommitFailedException as e:
        raise MirrorError(f"table {location}: the catalog refused {what} ({e}): another writer committed meanwhile; "
                          "nothing committed") from e


def assert_head(tx, base: int) -> None:
    """The catalog takes transaction ``tx`` only while the table's main branch is at snapshot ``base`` (a commit
    that makes no snapshot, e.g. properties only: the check a snapshot's commit carries anyway)."""
    from pyiceberg.table.update import AssertRefSnapshotId

    tx._apply((), (AssertRefSnapshotId(snapshot_id=None if base == NO_SNAPSHOT else base, ref="main"),))


def commit_files(tx, tbl, *, adds: list, removes: set[str], properties: dict[str, str], base: int | None = None,
                 operation=None, what: str = "the commit", location: str | None = None) -> dict[str, list]:
    """One snapshot in transaction ``tx``: the DataFiles ``adds`` (data and position-delete files) added, the
    files whose paths are in ``removes`` (data or delete files) removed; based on snapshot ``base`` (default:
    the transaction's head now), refused if the table is not there or moves before the catalog commit.
    ``operation``: the snapshot's (default: append, or overwrite when it removes or deletes rows); ``location``:
    the table's, for messages (default: the catalog's). Returns the new manifests' paths with the DataFiles each
    holds (what a reader of the manifests would get: ``live_files`` need not read them back)."""
    from pyiceberg.table.snapshots import Operation

    if operation is None:
        operation = Operation.OVERWRITE if removes or any(f.content != 0 for f in adds) else Operation.APPEND
    p = _producer_type()(operation, tx, tbl.io, snapshot_properties=dict(properties))
    p.adds, p.removes, p.what = adds, removes, what
    p.want = head_id(tx.table_metadata) if base is None else base
    p.location = location or tbl.location()
    p._validate_concurrency()  # the transaction's head is the planned snapshot: else refused before writing
    for f in adds:
        p.append_data_file(f)
    with p:
        pass
    return getattr(p, "fresh", {})


def table_epoch(metadata) -> int:
    """The writer epoch table ``metadata`` holds (0: none)."""
    v = metadata.properties.get(PROP_WRITER_EPOCH)
    return int(v) if v and v.isdigit() else 0


def commit_epoch(tbl, epoch: int, location: str) -> None:
    """Make ``epoch`` the writer epoch of table ``tbl`` (a table property), unless it is already; LeaseLost if
    it holds a higher one. The property comes with a snapshot of its own (no file added or removed): a snapshot
    moves the main branch, which every data commit of a deposed writer asserts, so that commit fails in the
    catalog from then on (a catalog checks a commit's requirements, and none names a property). A commit refused
    for another writer's (a deposed writer's, landed first) is tried again after it."""
    from pyiceberg.exceptions import CommitFailedException, ValidationException

    what = f"publishing writer epoch {epoch}"
    for _ in range(EPOCH_TRIES):
        tbl.refresh()
        have = table_epoch(tbl.metadata)
        check_epoch(location, have, epoch, what)
        if have == epoch:
            return
        try:
            with fenced(location, what), transaction(tbl) as tx:
                commit_files(tx, tbl, adds=[], removes=set(), properties={PROP_WRITER_EPOCH: str(epoch)},
                             what=what, location=location)
                tx.set_properties({PROP_WRITER_EPOCH: str(epoch)})
            return
        except MirrorError as e:
            if not isinstance(e.__cause__, (CommitFailedException, ValidationException)):
                raise
    raise MirrorError(f"table {location}: writer epoch {epoch} was not published: the catalog refused each of "
                      f"{EPOCH_TRIES} commits for another writer's; nothing deleted")


_TYPES: dict[str, type] = {}


class _Manifests:
    """What our producer adds to pyiceberg's: the transaction's metadata read once per attempt (pyiceberg rebuilds
    it at every access: a deep copy, growing with the table's snapshots), and manifest writers of both kinds."""

    def _meta(self):
        if getattr(self, "_cached", None) is None:
            self._cached = self._transaction.table_metadata
        return self._cached

    def _manifests(self) -> list:
        """The new snapshot's manifests (the producer's ``_made``), kept for the manifest list's cache."""
        self.listed = self._made()
        return self.listed

    def _commit(self):
        """The new snapshot's manifest list written and its updates made, as pyiceberg's ``_commit`` does; the
        list's manifests kept as its writer wrote them (``cached.listed``): the new snapshot's live files need not
        read it back. A v2 table's list is written by ``manifest_list.write_list`` (its schemas built once, a
        carried manifest's record encoded once); a v1 table's by pyiceberg."""
        from pyiceberg.table.snapshots import Snapshot
        from pyiceberg.table.update import AddSnapshotUpdate, AssertRefSnapshotId, SetSnapshotRefUpdate

        meta = self._meta()
        if meta.format_version != 2:
            updates, requirements = super()._commit()
            snap = updates[0].snapshot
            listed(snap.manifest_list, self._prepared(snap.sequence_number, self.listed)[1])
            return updates, requirements
        new, seq = self._manifests(), meta.next_sequence_number()
        summary = self._summary(self.snapshot_properties)
        path = self._write_list(new, seq)
        add = AddSnapshotUpdate(snapshot=Snapshot(
            snapshot_id=self._snapshot_id, parent_snapshot_id=self._parent_snapshot_id, manifest_list=path,
            sequence_number=seq, summary=summary, schema_id=meta.current_schema_id))
        branch = self._target_branch
        if branch is None:
            return (add,), ()
        from pyiceberg.table.refs import SnapshotRefType

        at = meta.refs[branch].snapshot_id if branch in meta.refs else None
        return ((add, SetSnapshotRefUpdate(snapshot_id=self._snapshot_id, parent_snapshot_id=self._parent_snapshot_id,
                                           ref_name=branch, type=SnapshotRefType.BRANCH)),
                (AssertRefSnapshotId(snapshot_id=at, ref=branch),))

    def _prepared(self, seq: int, manifests: list) -> tuple[dict, tuple]:
        """(the list's header metadata, ``manifests`` as the new snapshot's list holds them: sequence numbers
        assigned, ``seq``)."""
        from pyiceberg.manifest import write_manifest_list

        made = write_manifest_list(format_version=self._meta().format_version, output_file=None,
                                   snapshot_id=self._snapshot_id, parent_snapshot_id=self._parent_snapshot_id,
                                   sequence_number=seq, avro_compression=self._compression)
        return made._meta, tuple(made.prepare_manifest(m) for m in manifests)

    def _write_list(self, manifests: list, seq: int) -> str:
        """The new snapshot's manifest list (a v2 table's) written where pyiceberg names it; its path."""
        from pyiceberg.table.update.snapshot import _new_manifest_list_file_name

        name = _new_manifest_list_file_name(snapshot_id=self._snapshot_id, attempt=0, commit_uuid=self.commit_uuid)
        path = self._transaction._table.location_provider().new_metadata_location(name)
        self._written_manifest_lists.append(path)
        meta, prepared = self._prepared(seq, manifests)
        write_list(self._io.new_output(path), meta, prepared)
        listed(path, prepared)
        return path

    def _refresh_for_retry(self) -> None:
        super()._refresh_for_retry()
        self._cached = None

    def schema(self):
        return self._meta().schema()

    def _writer(self, content):
        from pyiceberg.manifest import ManifestContent, write_manifest

        meta = self._meta()
        if content == ManifestContent.DELETES or meta.format_version == 2:  # (a v1 table: pyiceberg's own writer)
            kind = _delete_writer_type() if content == ManifestContent.DELETES else _data_writer_type()
            return kind(meta.spec(), meta.schema(), self.new_manifest_output(), self._snapshot_id, self._compression)
        return write_manifest(format_version=meta.format_version, spec=meta.spec(), schema=meta.schema(),
                              output_file=self.new_manifest_output(), snapshot_id=self._snapshot_id,
                              avro_compression=self._compression)


def _producer_type() -> type:
    """Our snapshot producer (pyiceberg's, imported when first needed): its new manifests (data and deletes),
    the parent's manifests carried (``_carried``), fenced at ``want``, a ``replace`` summed up."""
    if "producer" in _TYPES:
        return _TYPES["producer"]
    from pyiceberg.exceptions import ValidationException
    from pyiceberg.manifest import ManifestContent, ManifestEntry, ManifestEntryStatus
    from pyiceberg.table.snapshots import Operation, Summary
    from pyiceberg.table.update.snapshot import _SnapshotProducer

    class Producer(_Manifests, _SnapshotProducer):  # commit_files sets adds, removes, want, what, location
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

        def _made(self) -> list:
            out, self.fresh = [], {}
            for content in (ManifestContent.DATA, ManifestContent.DELETES):
                new = [f for f in self.adds if (f.content == 0) == (content == ManifestContent.DATA)]
                if new:
                    with self._writer(content) as w:
                        for f in new:
                            w.add(ManifestEntry.from_args(
                                status=ManifestEntryStatus.ADDED, snapshot_id=self._snapshot_id,
                                sequence_number=None, file_sequence_number=None, data_file=f))
                    out.append(w.to_manifest_file())
                    self.fresh[out[-1].manifest_path] = new
            return out + _carried(self, self.removes)

    _TYPES["producer"] = Producer
    return Producer


def _data_writer_type() -> type:
    """pyiceberg's v2 manifest writer, its Avro schemas built once per table schema and spec
    (``cached.manifest_output``)."""
    if "data" in _TYPES:
        return _TYPES["data"]
    from pyiceberg.manifest import ManifestWriterV2

    class DataManifestWriter(ManifestWriterV2):
        def new_writer(self):
            return manifest_output(self)

    _TYPES["data"] = DataManifestWriter
    return DataManifestWriter


def _delete_writer_type() -> type:
    """A manifest writer of ``content = deletes`` (pyiceberg writes data manifests only)."""
    if "deletes" in _TYPES:
        return _TYPES["deletes"]
    from pyiceberg.manifest import ManifestContent

    class DeleteManifestWriter(_data_writer_type()):
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
    parent = self._meta().snapshot_by_id(self._parent_snapshot_id) \
        if self._parent_snapshot_id is not None else None
    for m in manifests(parent, self._io) if parent is not None else []:
        if not removes:
            out.append(m)
            continue
        entries = manifest_entries(m, self._io)
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
