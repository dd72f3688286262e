"""#45 item 1: a writer that stalls past its lease cannot make the table unreadable, and #45 item 7: a release
never deletes another writer's lease, a skipped batch deletes the files its claims name. Real Delta and Iceberg
tables on a local directory and on the S3 server, the mirror's Spark path (``MirrorBatch``) on a local
SparkSession; each writer holds the lease as the mirror job does (``writer_lock``). Time is injected, never
slept: the stalled writer's renewals stop, and the writer that takes over sees its record unchanged for the
expiry on a monotonic clock of its own that moves while it waits (its wall clock an hour ahead, so the record's
written expiry has passed)."""

from __future__ import annotations

import json
import re
import threading
import time
from contextlib import contextmanager

import pyarrow as pa
import pytest

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror import apply_batch, open_table
from msgstream_spark.mirror.store import Lease, LeaseHeld, LeaseLost, open_store
from msgstream_spark.mirror.store import writer as lock
from msgstream_spark.spark.mirror import MirrorBatch
from tests.mirror.changes import FIELDS, model, table_state, to_arrow
from tests.mirror.writers import BATCHES, Clock, planned, staged_files


class Place:
    """A table location: a local directory, or a bucket on the S3 server (an Iceberg table there in a SQLite
    catalog file beside the test)."""

    def __init__(self, kind: str, tmp_path, s3=None) -> None:
        self.kind = kind
        self.opts = s3.options() if s3 is not None else None
        self.loc = s3.uri("lake", "t") if s3 is not None else str(tmp_path / "t")
        self.catalog = f"sqlite:///{tmp_path / 'catalog.sqlite'}" if s3 is not None else None

    def open(self, fmt: str, create: bool = True):
        more = {"catalog_uri": self.catalog} if fmt == "iceberg" and self.catalog else {}
        return open_table(fmt, self.loc, collection="coll", pk="pk", arrow_schema=FIELDS if create else None,
                          create=create, storage_options=self.opts, **more)

    def store(self):
        return open_store(self.loc, self.opts, env={})

    def read(self, fmt: str) -> dict:
        """The table as deltalake / a plain pyiceberg catalog read it, after checking every file it names is in
        the store (a reader fails with file-not-found on the first that is not)."""
        store = self.store()
        if fmt == "delta":
            import deltalake

            dt = deltalake.DeltaTable(self.loc, storage_options=self.opts or {})
            missing = [f for f in dt.file_uris() if store.head(f) is None]
            assert not missing, f"the table names deleted data files: {missing}"
            got = pa.table(deltalake.QueryBuilder().register("t", dt).execute("SELECT * FROM t").read_all())
            return table_state(got.cast(pa.schema([f.with_type(pa.string()) if pa.types.is_string_view(f.type)
                                                   else f for f in got.schema])))
        if fmt == "lance":
            import lance

            from msgstream_spark.mirror.formats.lance.options import dataset_uri
            from msgstream_spark.mirror.store import uri

            ds = lance.dataset(dataset_uri(self.loc), storage_options={**(self.opts or {}), "allow_http": "true"})
            named = [uri.join(self.loc, "data", d.path) for f in ds.get_fragments() for d in f.metadata.files]
            named += [uri.join(self.loc, f.deletion_file()) for f in ds.get_fragments() if f.deletion_file()]
            missing = [p for p in named if store.head(p) is None]
            assert not missing, f"the table names deleted data files: {missing}"
            return table_state(ds.to_table())
        from pyiceberg.catalog.sql import SqlCatalog

        from msgstream_spark.mirror.store.settings import for_pyiceberg

        cat = SqlCatalog("msgstream", uri=self.catalog or f"sqlite:///{self.loc}_catalog.sqlite",
                         **for_pyiceberg(self.opts or {}))
        scan = cat.load_table(("msgstream", "coll")).scan()
        named = [p for task in scan.plan_files() for p in [task.file.file_path, *(d.file_path for d in
                                                                                   task.delete_files)]]
        missing = [p for p in named if store.head(p) is None]
        assert not missing, f"the table names deleted data files: {missing}"
        return table_state(scan.to_arrow())


@pytest.fixture(params=["local", "s3"])
def place(request, tmp_path) -> Place:
    return Place(request.param, tmp_path, request.getfixturevalue("s3") if request.param == "s3" else None)


def _stall(lease: Lease) -> None:
    """The holder's process pauses (a GC or VM pause): its renewals stop too."""
    lease._stop.set()
    lease._thread.join(timeout=30)


def _clocks_of_b() -> dict:
    """Writer B's clocks: its wall clock an hour ahead of this machine's, a monotonic clock its waits move."""
    wall, mono = Clock(time.time() + 3600), Clock()
    return {"clock": wall, "monotonic": mono, "sleep": mono.sleep}


@pytest.fixture
def writer_b_clocks(monkeypatch):
    """The leases writer_lock takes on the thread named "writer B" run on B's clocks."""
    real, b = lock.Lease, _clocks_of_b()

    def lease(store, location, what, **kw):
        return real(store, location, what, **{**kw, **(b if threading.current_thread().name == "writer B" else {})})

    monkeypatch.setattr(lock, "Lease", lease)


def _stalled_writer(fmt: str, place: Place, spark, monkeypatch, stall_in) -> MirrorError:
    """Writer A (``MirrorBatch`` in A's job) commits batch 0, writes batch 1's files and passes its lease check;
    ``stall_in(t_a, stall)`` patches the point where A stalls (``with stall(): <A's next step>``): its renewals
    stop, B takes the lease over and runs batch 1 of the same query up to the writing of its own files (having
    deleted what A's attempt claimed), A's next step runs, then B's batch completes. What A's batch raised."""
    from msgstream_spark.spark import mirror as spark_mirror

    cleared, a_done, errors = threading.Event(), threading.Event(), []
    real_write = spark_mirror.write_in_tasks

    def write_in_tasks(*args, **kw):  # B's, after it cleared the earlier attempt's files: held while A commits
        if threading.current_thread().name == "writer B":
            cleared.set()
            assert a_done.wait(timeout=300)
        return real_write(*args, **kw)

    monkeypatch.setattr(spark_mirror, "write_in_tasks", write_in_tasks)

    def writer_b() -> None:
        try:
            with lock.writer_lock(place.store(), place.loc, "writer B's job") as hold_b:
                sink = MirrorBatch(place.open(fmt, create=False), "pk", query_id="q", lock=hold_b)
                sink(spark.createDataFrame(to_arrow(BATCHES[1])), 1)
        except BaseException as e:  # noqa: BLE001 - reported by the test's thread below
            errors.append(e)
            cleared.set()

    t_a = place.open(fmt)
    b = threading.Thread(target=writer_b, name="writer B")
    with lock.writer_lock(t_a.store, t_a.location, "writer A's job") as hold_a:
        sink_a = MirrorBatch(t_a, "pk", query_id="q", lock=hold_a)
        sink_a(spark.createDataFrame(to_arrow(BATCHES[0])), 0)

        @contextmanager
        def stall():
            _stall(hold_a.lease)
            held, lock._held = lock._held, {}  # B is another process: its own holds
            b.start()
            try:
                assert cleared.wait(timeout=300)
                yield
            finally:
                a_done.set()
                b.join(timeout=300)
                lock._held = held

        stall_in(t_a, stall)
        with pytest.raises(MirrorError) as refused:
            sink_a(spark.createDataFrame(to_arrow(BATCHES[1])), 1)
    assert not errors, errors
    assert place.read(fmt) == model(BATCHES[0] + BATCHES[1])
    assert place.open(fmt, create=False).last_batch("q") == 1
    return refused.value


@pytest.mark.parametrize("fmt", ["delta", "iceberg", "lance"])
def test_a_writer_stalled_past_its_lease_cannot_make_the_table_unreadable(fmt, place, spark, writer_b_clocks,
                                                                          monkeypatch):
    """Writer A writes batch 1's files, passes its lease check and stalls before its commit; B takes the lease
    over, runs the same batch of the same query and deletes the files A's attempt claimed; A wakes. A's commit
    is refused (the table holds B's epoch), and the table stays readable: every file it names exists and it
    holds both batches once. Before #45 A's commit landed and named B's deleted files (Delta; Iceberg's commit
    happened to read the deleted files' footers first and failed)."""
    def before_the_commit(t_a, stall) -> None:
        real = t_a.commit

        def commit(*args, **kw):
            with stall():  # A commits while B is at work
                return real(*args, **kw)

        t_a.commit = commit

    refused = _stalled_writer(fmt, place, spark, monkeypatch, before_the_commit)
    assert isinstance(refused, LeaseLost), refused
    assert "another writer took the table over" in str(refused)
    assert "batch 1 of query q refused, nothing committed" in str(refused)


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_a_writer_stalled_right_before_its_publication_loses_the_race(fmt, tmp_path, spark, writer_b_clocks,
                                                                      monkeypatch):
    """The same, A stalling inside its commit after every check and read, right before the put of its Delta
    version / the catalog commit of its Iceberg snapshot: B's epoch, published before B deleted A's files,
    took the version (Delta) / moved the snapshot A's commit asserts (Iceberg). Before #45 A's commit landed in
    both formats and every reader of the table failed on a deleted file."""
    from pyiceberg.table import Transaction

    from msgstream_spark.mirror.formats.delta import table as delta_table

    # Delta: the put-if-absent of the version; Iceberg: the transaction's commit in the catalog
    module, name = (delta_table, "write_commit") if fmt == "delta" else (Transaction, "commit_transaction")

    def at_the_publication(t_a, stall) -> None:
        real, main = getattr(module, name), threading.current_thread()

        def publish(*args, **kw):
            if threading.current_thread() is main and getattr(module, name) is publish:
                monkeypatch.setattr(module, name, real)  # once
                with stall():  # A publishes while B is at work
                    return real(*args, **kw)
            return real(*args, **kw)

        monkeypatch.setattr(module, name, publish)

    refused = _stalled_writer(fmt, Place("local", tmp_path), spark, monkeypatch, at_the_publication)
    want = r"Delta version \d+ was written by another writer meanwhile" if fmt == "delta" else \
        r"moved from snapshot \d+, which batch 1 of query q was planned on"
    assert re.search(want, str(refused)), refused


def test_a_writer_whose_lease_is_lost_starts_no_batch(tmp_path, spark):
    """A stalled writer's renewal finds its lease taken over (it is marked lost): its next batch is refused
    before it deletes anything, so the files of the new holder's batch in flight stay. Before #45 the batch
    deleted them (an earlier attempt's, it took them for) and was refused only at its commit."""
    from msgstream_spark.mirror.write.layout import TaskWriter
    from msgstream_spark.mirror.write.taskplan import ChangesFile, changes_dir, claims_dir, data_files

    loc = str(tmp_path / "t")
    t = open_table("delta", loc, collection="coll", pk="pk", arrow_schema=FIELDS)
    with lock.writer_lock(t.store, loc, "writer A's job") as hold_a:
        assert apply_batch(t, to_arrow(BATCHES[0]), "pk", "q", 0)
        df = spark.createDataFrame(to_arrow(BATCHES[1]))
        _stall(hold_a.lease)
        b = Lease(t.store, loc, "writer B's job", **_clocks_of_b()).acquire()  # B, another process, takes over
        try:  # B's batch 1 in flight: a writing task's claimed data file
            spec = t.write_spec()
            at = changes_dir(spec.data_dir, "q", 1)
            w, ch = TaskWriter(spec, claims=claims_dir(at)), ChangesFile(t.store, at, spec.key_type)
            ch.add(w.add(to_arrow(BATCHES[1])))
            b_files = data_files(ch.close(w.close()))
            with pytest.raises(LeaseLost, match="taken over"):
                hold_a.lease.renew()  # A wakes: its renewal finds the lease another writer's
            with pytest.raises(LeaseLost):
                MirrorBatch(t, "pk", query_id="q", lock=hold_a)(df, 1)
            assert b_files and all(t.store.head(p) is not None for p in b_files)
        finally:
            b.release()
    assert table_state(t.to_arrow()) == model(BATCHES[0]) and t.last_batch("q") == 0


@pytest.mark.parametrize("fmt", ["delta", "iceberg", "lance"])
def test_a_deposed_writer_that_passed_every_check_loses_the_race_to_the_new_epoch(fmt, place, monkeypatch):
    """A stalls inside its commit, after it read the table and checked its epoch, right before it publishes; B
    takes the lease over and publishes its epoch (a Delta version / an Iceberg snapshot of its own). A's commit
    then loses: Delta's version is taken, Iceberg's catalog refuses a snapshot planned on a head that moved (and
    our producer refuses pyiceberg's rebase). Nothing of A's lands; B's batch does."""
    from msgstream_spark.mirror.formats.delta import table as delta_table
    from msgstream_spark.mirror.formats.iceberg import table as iceberg_table
    from msgstream_spark.mirror.formats.lance.table import LanceMirrorTable
    from msgstream_spark.mirror.write.batch import commit_plan

    t_a = place.open(fmt)
    assert apply_batch(t_a, to_arrow(BATCHES[0]), "pk", "q", 0)
    clock = Clock()
    hold_a = clock.hold(t_a.store, place.loc, "writer A")
    p = planned(t_a, BATCHES[1])
    module, name = {"delta": (delta_table, "write_commit"), "iceberg": (iceberg_table, "commit_files"),
                    "lance": (LanceMirrorTable, "_commit")}[fmt]
    real = getattr(module, name)
    holds = []

    def stalled(*args, **kw):
        if not holds:  # A stalls past its expiry; B takes over and fences the table
            clock.now += 61
            holds.append(clock.hold(t_a.store, place.loc, "writer B"))
            holds[0].fence(place.open(fmt, create=False))
        return real(*args, **kw)

    monkeypatch.setattr(module, name, stalled)
    want = {"delta": r"Delta version \d+ was written by another writer meanwhile",
            "iceberg": rf"moved from snapshot {p.base}, which batch 1 of query q was planned on",
            "lance": r"another writer committed while batch 1 of query q was committed \(Lance refused it"}[fmt]
    with pytest.raises(MirrorError, match=want):
        commit_plan(t_a, p, set(), query_id="q", batch_id=1, hold=hold_a)
    monkeypatch.setattr(module, name, real)
    hold_b = holds[0]
    assert hold_b.epoch == hold_a.epoch + 1 and place.open(fmt, create=False).writer_epoch() == hold_b.epoch
    assert place.read(fmt) == model(BATCHES[0])
    with pytest.raises(LeaseLost, match="no longer this writer's"):  # A's own check, if it gets that far
        commit_plan(t_a, planned(t_a, BATCHES[1]), set(), query_id="q", batch_id=1, hold=hold_a)
    with pytest.raises(LeaseLost, match=f"writer epoch {hold_b.epoch} is above this writer's {hold_a.epoch}"):
        t_a.commit(planned(t_a, BATCHES[1]), query_id="q", batch_id=1, epoch=hold_a.epoch)  # the table's
    t_b = place.open(fmt, create=False)
    assert commit_plan(t_b, planned(t_b, BATCHES[1]), set(), query_id="q", batch_id=1, hold=hold_b) is not None
    assert place.read(fmt) == model(BATCHES[0] + BATCHES[1])


@pytest.mark.parametrize("fmt", ["delta", "iceberg", "lance"])
def test_a_lease_made_anew_takes_an_epoch_above_the_tables(fmt, tmp_path):
    """The lease object deleted by hand while the table holds epoch 2: the next holder's lease starts at 1 and
    its fence raises it above the table's before publishing; the holder of epoch 2 is refused from then on. A
    holder's second fence publishes nothing more. A commit's own lease made anew below the table's epoch has
    its epoch raised (it still holds its lease: the table's epoch is from before it) and commits."""
    t = open_table(fmt, str(tmp_path / "t"), collection="coll", pk="pk", arrow_schema=FIELDS)
    clock = Clock()
    first = clock.hold(t.store, t.location, "writer A")
    first.lease.release()
    second = clock.hold(t.store, t.location, "writer B")
    second.fence(t)
    assert (first.epoch, second.epoch, t.writer_epoch()) == (1, 2, 2)
    t.store.delete(second.lease.uri)
    third = clock.hold(t.store, t.location, "writer C")
    assert third.epoch == 1
    third.fence(t)
    assert third.epoch == t.writer_epoch() == 3 and third.published
    head = t.live_files().version
    third.fence(t)
    assert t.live_files().version == head  # published once
    with pytest.raises(LeaseLost, match="writer epoch 3 is above this writer's 2"):
        t.commit(planned(t, BATCHES[0]), query_id="q", batch_id=0, epoch=second.epoch)
    assert t.commit(planned(t, BATCHES[0]), query_id="q", batch_id=0, epoch=third.epoch)
    third.lease.release()
    t.store.delete(third.lease.uri)  # again: the next commit's own lease starts at 1, below the table's 3
    assert apply_batch(t, to_arrow(BATCHES[1]), "pk", "q", 1)  # its epoch raised to 4, the commit made again
    assert json.loads(t.store.read(third.lease.uri))["epoch"] == 4
    assert table_state(t.to_arrow()) == model(BATCHES[0] + BATCHES[1])


def test_a_deposed_writer_deletes_nothing_of_its_successors_attempt(tmp_path):
    """Attempts of a batch keep their files under the epoch of their writer: a deposed writer that passed its
    checks before it stalled (it clears epochs up to its own) leaves its successor's attempt whole."""
    from msgstream_spark.mirror.write.layout import TaskWriter
    from msgstream_spark.mirror.write.taskplan import (
        ChangesFile,
        attempt_dir,
        changes_dir,
        claims_dir,
        data_files,
        drop_lost_files,
        remove_changes,
    )

    t = open_table("delta", str(tmp_path / "t"), collection="coll", pk="pk", arrow_schema=FIELDS)
    spec = t.write_spec()
    batch = changes_dir(spec.data_dir, "q", 1)

    def attempt(epoch: int) -> list[str]:
        at = attempt_dir(batch, epoch)
        w, ch = TaskWriter(spec, claims=claims_dir(at)), ChangesFile(t.store, at, spec.key_type)
        ch.add(w.add(to_arrow(BATCHES[1])))
        return data_files(ch.close(w.close()))

    mine, successors = attempt(4), attempt(5)
    assert drop_lost_files(t.store, batch, spec.data_dir, epochs=(0, 4)) == mine
    remove_changes(t.store, batch, (0, 4))
    assert all(t.store.head(p) is not None for p in successors)
    left = sorted(m.uri for m in t.store.list(batch))
    assert left and all(u.startswith(attempt_dir(batch, 5) + "/") for u in left)


def test_a_release_never_deletes_the_lease_another_writer_took(tmp_path, monkeypatch):
    """#45 item 7: a first run that leaves no table behind removes its lease object; if another writer asks for
    the lease between the listing that found the location empty and that removal, it either waits for this
    holder (it still holds the lease) or gets a lease object that stays. Before #45 the holder released first
    and then deleted whatever lease object was there: the other writer's."""
    loc = str(tmp_path / "t")
    store = open_store(loc)
    real = lock._only_the_lease
    calls, taken = [], []

    def listing_then_another_writer(*args):
        got = real(*args)
        calls.append(got)
        if len(calls) == 2:  # the listing on the way out: another writer asks for the lease right after it
            try:
                taken.append(Lease(store, loc, "writer B", auto_renew=False).acquire())
            except LeaseHeld:
                pass
        return got

    monkeypatch.setattr(lock, "_only_the_lease", listing_then_another_writer)
    with lock.writer_lock(store, loc, "writer A's first run"):
        pass
    assert calls == [True, True]
    if not taken:  # refused while A held it: B takes it now
        taken.append(Lease(store, loc, "writer B", auto_renew=False).acquire())
    taken[0].check()  # B's lease object is in the store
    taken[0].release()


@pytest.mark.parametrize("fmt", ["delta", "iceberg", "lance"])
def test_a_batch_skipped_on_re_run_deletes_the_files_its_claims_name(fmt, tmp_path):
    """#45 item 7: a driver killed after a batch's commit and before its cleanup left the batch's claims: of the
    files they name, the committed one stays and the lost task attempt's goes when the re-run skips the batch
    (before #45 only the claims went, the file stayed until a vacuum)."""
    from msgstream_spark.mirror.maintenance import orphans
    from msgstream_spark.mirror.write.batch import commit_plan
    from msgstream_spark.mirror.write.layout import TaskWriter
    from msgstream_spark.mirror.write.taskplan import (
        ChangesFile,
        changes_dir,
        claims_dir,
        data_files,
        merge_plans,
        plan_out_schema,
    )

    t = open_table(fmt, str(tmp_path / "t"), collection="coll", pk="pk", arrow_schema=FIELDS)
    spec = t.write_spec()
    at = changes_dir(spec.data_dir, "q", 0)

    def task(msgs) -> pa.Table:
        w, ch = TaskWriter(spec, claims=claims_dir(at)), ChangesFile(t.store, at, spec.key_type)
        ch.add(w.add(to_arrow(msgs)))
        return ch.close(w.close())

    kept, lost = task(BATCHES[0]), task(BATCHES[0])  # the second: a task attempt whose result was lost
    kept_files = [p for p in staged_files(t, data_files(kept)) if not p.endswith(".json")]  # (Lance: a report)
    lost_files = staged_files(t, data_files(lost))
    planned = plan_out_schema(pa.int64()).empty_table()  # (an insert-only batch on an empty table)
    assert commit_plan(t, merge_plans(kept, planned, t.live_files().version), set(), query_id="q",
                       batch_id=0) is not None  # the killed run's commit
    sink = MirrorBatch(t, "pk", query_id="q")
    sink(None, 0)  # the re-run hands Spark's batch 0 again (the skip reads no row of it)
    assert sink.skipped == 1 and sink.batches == 0
    assert all(t.store.head(p) is not None for p in kept_files)
    assert lost_files and all(t.store.head(p) is None for p in lost_files)
    assert not list(t.store.list(at)) and orphans(t) == []
    assert table_state(t.to_arrow()) == model(BATCHES[0])


@pytest.mark.parametrize("fmt", ["delta", "iceberg", "lance"])
def test_a_vacuum_fences_a_deposed_writer_before_it_deletes(fmt, tmp_path):
    """A vacuum that deletes every unreferenced file (``retain_s=0``) takes the lease from a writer that stalled
    with its batch's files written and not committed: it publishes its epoch first, so the writer's commit of
    the files it deleted is refused when the writer wakes, and the table stays readable."""
    from msgstream_spark.mirror.maintenance import vacuum

    loc = str(tmp_path / "t")
    t = open_table(fmt, loc, collection="coll", pk="pk", arrow_schema=FIELDS)
    assert apply_batch(t, to_arrow(BATCHES[0]), "pk", "q", 0)
    hold_a = lock.Hold("writer A", Lease(t.store, loc, "writer A", expiry_s=0.3, auto_renew=False).acquire())
    p = planned(t, BATCHES[1])  # then A stalls, renewing nothing
    staged = set(staged_files(t, p.adds, p.info))
    deadline = time.monotonic() + 60
    while True:
        try:
            gone = vacuum(open_table(fmt, loc, collection="coll", pk="pk"), retain_s=0)
            break
        except LeaseHeld:
            assert time.monotonic() < deadline
            time.sleep(0.05)
    assert staged <= set(gone)
    with pytest.raises(LeaseLost, match="another writer took the table over"):
        t.commit(p, query_id="q", batch_id=1, epoch=hold_a.epoch)
    assert table_state(open_table(fmt, loc, collection="coll", pk="pk").to_arrow()) == model(BATCHES[0])

