"""A Delta mirror table on each kind of store (a local directory and a bucket on the S3 server), Spark-free:
batches committed by put-if-absent and read back by plain readers with the same storage options; two writers
racing for one version (one wins); checkpoints written and read on the store (the commits before one removed);
delta-rs's own optimize and vacuum between two batches; a deletion vector removed by another tool refused
naming it; compaction, orphans and vacuum; the change log; verify and repair; what each step moved."""

from __future__ import annotations

import pyarrow as pa
import pytest

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror import apply_batch, open_table
from msgstream_spark.mirror.maintenance import compact, orphans, vacuum
from msgstream_spark.mirror.store import io_since, io_totals, open_store
from msgstream_spark.mirror.write.batch import lookup_local
from msgstream_spark.mirror.write.layout import plan, write_changes
from tests.mirror.changes import (
    FIELDS,
    HeldMilvus,
    delete,
    fill,
    insert,
    mixed_batches,
    model,
    table_state,
    to_arrow,
    upsert,
)
from tests.mirror.store.racing import race


class Where:
    """Table locations on one store: ``uri(name)``, the storage options a user passes (None locally)."""

    def __init__(self, kind: str, tmp_path, s3=None) -> None:
        self.kind, self.tmp, self.s3 = kind, tmp_path, s3
        self.opts = s3.options() if s3 is not None else None

    def uri(self, name: str) -> str:
        return self.s3.uri("lake", name) if self.s3 is not None else str(self.tmp / name)

    def store(self, name: str):
        return open_store(self.uri(name), self.opts, env={})


@pytest.fixture(params=["local", "s3"])
def where(request, tmp_path) -> Where:
    return Where(request.param, tmp_path, request.getfixturevalue("s3") if request.param == "s3" else None)


def _open(where: Where, name: str = "t", create: bool = True):
    return open_table("delta", where.uri(name), collection="coll", pk="pk", arrow_schema=FIELDS if create else None,
                      create=create, storage_options=where.opts)


def plain_reads(where: Where, name: str = "t") -> list[dict]:
    """The table as delta-rs, Polars and DuckDB read it (each configured with the same storage options)."""
    import deltalake
    import polars as pl

    loc, so = where.uri(name), where.opts or {}
    dt = deltalake.DeltaTable(loc, storage_options=so)
    rs = pa.table(deltalake.QueryBuilder().register("t", dt).execute("SELECT * FROM t").read_all())
    rs = rs.cast(pa.schema([f.with_type(pa.string()) if pa.types.is_string_view(f.type) else f for f in rs.schema]))
    out = [table_state(rs), table_state(pl.read_delta(loc, storage_options=so or None).to_arrow())]
    if where.s3 is not None:
        from tests.fixtures.plain_readers import duckdb_on_s3

        con = duckdb_on_s3(so)
        out.append(table_state(con.execute(f"SELECT * FROM delta_scan('{loc}')").fetch_arrow_table()))
    return out


def test_batches_on_the_store_are_what_plain_readers_read(where):
    t = _open(where)
    seen = fill(t, mixed_batches(4))
    want = model(seen)
    assert table_state(t.to_arrow()) == want
    assert all(got == want for got in plain_reads(where))
    assert any(len(f.deleted) for f in t.live_files())  # the layout really has deletion vectors
    names = {m.uri.removeprefix(where.uri("t") + "/") for m in where.store("t").list(where.uri("t"))}
    assert {"_delta_log/00000000000000000004.json", "_msgstream_writer.lease"} <= names
    assert all(n.startswith(("_delta_log/", "data/", "deletion_vector_", "_msgstream_writer")) for n in names), names


def test_two_writers_racing_for_one_version_one_wins(where):
    """Two handles plan a batch on one version and publish at once, with no lease between them: the version is
    created once (put-if-absent: a hard link locally, If-None-Match: * on S3); the other commits nothing."""
    t = _open(where)
    seen = fill(t, mixed_batches(1))
    writers, plans = [_open(where, create=False) for _ in range(2)], []
    for i, w in enumerate(writers):
        narrow = write_changes(to_arrow([insert(100 + i, (1, f"w{i}"), (50 + i, f"n{i}"))]), w.write_spec())
        files = w.live_files()
        plans.append(plan(narrow, lookup_local(w, narrow.column("key").combine_chunks(), files), files.version))
    won, lost = race([lambda i=i: (writers[i].commit(plans[i], query_id=f"w{i}", batch_id=0), i)[1]
                      for i in range(2)], MirrorError)
    assert len(won) == 1 and len(lost) == 1
    assert "was written by another writer meanwhile; nothing committed" in str(lost[0])
    i = won[0]
    assert table_state(_open(where, create=False).to_arrow()) == model(seen + [insert(100 + i, (1, f"w{i}"),
                                                                                      (50 + i, f"n{i}"))])
    loser = writers[1 - i]
    assert loser.last_batch(f"w{1 - i}") is None


def test_checkpoints_are_written_and_read_on_the_store(where, monkeypatch):
    """Every CHECKPOINT_EVERY commits delta-rs writes a checkpoint with the store's options; a new reader starts
    from it, also when the commits before it are gone (log cleanup), and the next batch is right."""
    from msgstream_spark.mirror.formats.delta import table as delta_table

    monkeypatch.setattr(delta_table, "CHECKPOINT_EVERY", 3)
    t = _open(where)
    seen = fill(t, mixed_batches(4))  # versions 1..4 (0: the create): a checkpoint at 3
    store = where.store("t")
    last = store.read(store.join("_delta_log", "_last_checkpoint"))
    assert b'"version":3' in last.replace(b" ", b"")
    for v in range(3):  # what a log cleanup removes: the checkpoint alone describes versions up to 3
        store.delete(store.join("_delta_log", f"{v:020d}.json"))
    again = _open(where, create=False)
    assert again.live_files().version == 4
    assert table_state(again.to_arrow()) == model(seen)
    more = [delete(500, 3), *upsert(501, (4, "late"))]
    assert apply_batch(again, to_arrow(more), "pk", "q", 4)
    assert table_state(_open(where, create=False).to_arrow()) == model(seen + more)
    assert all(got == model(seen + more) for got in plain_reads(where))


@pytest.mark.parametrize("op", ["optimize", "vacuum"])
def test_delta_rs_maintenance_between_batches_is_read_right(where, op):
    """delta-rs's own OPTIMIZE (compaction: files with deletion vectors rewritten) or VACUUM (retention 0) runs
    between two batches: the next batch reads the table as delta-rs left it and commits right."""
    import deltalake

    t = _open(where)
    seen = fill(t, mixed_batches(4))
    dt = deltalake.DeltaTable(where.uri("t"), storage_options=where.opts or {})
    if op == "optimize":
        got = dt.optimize.compact()
        assert got["numFilesRemoved"] > 1 and got["numFilesAdded"] == 1
    else:
        fill(t, [[delete(200, 30)]], 4)  # a removal a vacuum may act on
        seen += [delete(200, 30)]
        dt.update_incremental()
        dt.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    more = [*upsert(300, *[(p, f"after.{p}") for p in range(0, 40, 3)]), delete(301, 5, 6)]
    assert apply_batch(t, to_arrow(more), "pk", "q", 10)
    want = model(seen + more)
    assert table_state(_open(where, create=False).to_arrow()) == want
    assert all(got == want for got in plain_reads(where))


def test_a_deletion_vector_another_tool_removed_is_refused_naming_it(where):
    t = _open(where)
    fill(t, mixed_batches(3))
    dv = next(f for f in t.live_files() if len(f.deleted))
    store = where.store("t")
    gone = next(m.uri for m in store.list(where.uri("t")) if "deletion_vector_" in m.uri
                and m.uri in t.referenced_files())
    store.delete(gone)
    with pytest.raises(MirrorError, match=r"deletion vector file .*deletion_vector_.* of data file .* is gone"):
        apply_batch(_open(where, create=False), to_arrow([delete(900, 7)]), "pk", "q", 3)
    assert dv.path in {f.path for f in t.live_files()}  # (this handle read the vectors before)


def test_compaction_orphans_and_vacuum_on_the_store(where):
    t = _open(where)
    seen = fill(t, mixed_batches(5))
    before = t.live_files()
    done = compact(t)
    assert done.files_in == len(before) and done.files_out == 1
    assert table_state(t.to_arrow()) == model(seen) and compact(t).files_in == 0
    left = orphans(t)
    assert {f.path for f in before} <= set(left)  # the compacted files (and their old vectors): no version's
    assert vacuum(t, retain_s=3600) == []  # removed within the retention: kept
    dry = vacuum(t, retain_s=0, dry_run=True)
    gone = vacuum(t, retain_s=0)
    assert gone == dry and set(left) <= set(gone) and orphans(t) == []
    store = where.store("t")
    assert not [p for p in gone if store.head(p) is not None]
    assert all(got == model(seen) for got in plain_reads(where))


def test_the_change_log_on_the_store(where):
    from msgstream_spark.mirror.history.table import HistoryTable, as_of

    h = HistoryTable(where.uri("h"), "pk", where.opts)
    seed = to_arrow([insert(10, (1, "a"), (2, "b"))]).drop_columns(["op", "_channel"])
    assert h.seed(lambda: seed) and not h.seed(lambda: seed)
    changes = to_arrow([*upsert(20, (1, "a2")), delete(21, 2)])
    existed = pa.table({"pk": pa.array([1, 2], pa.int64()), "_ts": pa.array([10, 10], pa.int64())})
    assert h.append(changes, existed, "q", 0) and not h.append(changes, existed, "q", 0)
    assert sorted((r["pk"], r["v"]) for r in as_of(h, 10).to_pylist()) == [(1, "a"), (2, "b")]
    assert sorted((r["pk"], r["v"]) for r in as_of(HistoryTable(where.uri("h"), "pk", where.opts), 21)
                  .to_pylist()) == [(1, "a2")]


class NoLog:
    def newest_time(self, channels) -> int:
        return 5000 << 18


def test_verify_and_repair_on_the_store(where):
    from msgstream_spark.mirror.verify.run import repair, run_verify

    t = _open(where)
    seen = fill(t, mixed_batches(2))
    milvus = HeldMilvus({pk: v for pk, (v, _) in model(seen).items()})
    assert run_verify(t, milvus, NoLog(), checkpoint=None).equal
    milvus.rows[3] = "changed in Milvus"
    del milvus.rows[4]
    got = run_verify(t, milvus, NoLog(), checkpoint=None)
    assert not got.equal and {(p["pk"], p["kind"]) for p in got.problems} == {(3, "stale"), (4, "extra")}
    assert repair(t, milvus, NoLog(), got, [])["keys"] == 2
    assert run_verify(_open(where, create=False), milvus, NoLog(), checkpoint=None).equal


def test_what_a_batch_moves_through_the_store_is_counted(where):
    t = _open(where)
    fill(t, mixed_batches(2))
    before = io_totals()
    assert apply_batch(t, to_arrow([*upsert(500, (1, "x"), (2, "y"))]), "pk", "q", 2)
    moved = io_since(before)
    store = where.store("t")
    v3 = store.head(store.join("_delta_log", f"{3:020d}.json"))
    assert moved["written"] >= v3.size and moved["read"] > 0 and moved["requests"] > 3


def _big_file(where: Where, n: int, monkeypatch):
    """A table with one data file of ``n`` random keys, its key index in blocks of 4 KiB fetched one block at a
    time (so that a small file has many units to fetch: the ranged reads are what is measured, not the size)."""
    import numpy as np

    from msgstream_spark.mirror.write import keycache, keyindex

    monkeypatch.setattr(keyindex, "BLOCK_BYTES", 4096)
    monkeypatch.setattr(keycache, "FETCH_BYTES", 4096)
    rng = np.random.default_rng(n)
    keys = rng.choice(10 * n, n, replace=False)
    t = _open(where, f"t{n}")
    assert apply_batch(t, to_arrow([insert(10, *[(int(k), f"v{k}") for k in keys])]), "pk", "q", 0)
    return t, keys


def _forget(cache_dir=None, monkeypatch=None) -> None:
    """A new worker process: nothing of the indexes kept in memory (and an empty local block cache)."""
    from msgstream_spark.mirror.store import parquet
    from msgstream_spark.mirror.write import keycache, keyindex

    keyindex._OPEN.clear()
    keyindex._VERIFIED.clear()
    parquet._FOOTERS.clear()
    keycache._CACHE.clear()
    if cache_dir is not None:
        monkeypatch.setenv(keycache.CACHE_DIR_ENV, str(cache_dir))


def test_a_lookup_on_s3_fetches_the_blocks_its_keys_touch_not_the_index(s3, tmp_path, monkeypatch):
    """A key index on the S3 server is read by range: a lookup of a few keys fetches its header and the blocks
    of those keys (the same bytes for a file ten times larger), an executor's next lookup of them fetches no
    block (its local block cache, bounded in bytes), and the answer is the file's own rows."""
    import pyarrow.parquet as pq

    from msgstream_spark.mirror.write.keycache import HEAD_BYTES
    from msgstream_spark.mirror.write.keyindex import side_path
    from msgstream_spark.mirror.write.layout import lookup_file

    where = Where("s3", tmp_path, s3)
    moved = {}
    for n in (2_000, 20_000):
        t, keys = _big_file(where, n, monkeypatch)
        [f] = t.live_files()
        side = where.store(f"t{n}").head(side_path(f.path))
        assert side is not None and side.size >= 32 * n  # written with the data file
        want = pa.array(sorted(int(k) for k in keys[:3]), pa.int64())
        _forget(tmp_path / f"cache{n}", monkeypatch)
        before = io_totals()
        got = lookup_file(f, "pk", want, pa.int64(), t.store)
        moved[n] = io_since(before)["read"]
        rows = pq.read_table(pa.BufferReader(t.store.read(f.path)), columns=["pk"]).column("pk").to_pylist()
        assert sorted(zip(got.column("key").to_pylist(), got.column("_pos").to_pylist())) == \
            sorted((k, rows.index(k)) for k in want.to_pylist())
        _forget()  # a new process on the same executor: the disk cache stays
        before = io_totals()
        assert lookup_file(f, "pk", want, pa.int64(), t.store).num_rows == 3
        assert io_since(before)["read"] <= HEAD_BYTES  # the header only: every block from the local cache
    # 3 keys: at most 3 blocks of keys, 3 of positions, 6 of _seq, and the header, whatever the file's size
    assert moved[20_000] <= HEAD_BYTES + 12 * 4096 < side.size / 5, moved


def test_a_warm_lookup_reads_the_cached_blocks_in_place(s3, tmp_path, monkeypatch):
    """With every block in the executor's cache a lookup allocates about what it finds, not a copy of the blocks
    its keys touch (joined first, they were every touched block of every file each batch: random keys touch all
    of a large table's index, 256 MiB copied per batch at 8M rows); the answer is the same."""
    import tracemalloc

    from msgstream_spark.mirror.write.layout import lookup_file

    where = Where("s3", tmp_path, s3)
    t, keys = _big_file(where, 20_000, monkeypatch)  # 4 KiB blocks: 40 of keys, 40 of positions, 79 of _seq
    [f] = t.live_files()
    want = pa.array(sorted(int(k) for k in keys[::200]), pa.int64())  # 100 keys spread over the file
    _forget(tmp_path / "cache", monkeypatch)
    first = lookup_file(f, "pk", want, pa.int64(), t.store)  # the blocks fetched into the cache
    _forget()  # a new process on the executor: the blocks memory-mapped from the cache
    lookup_file(f, "pk", want, pa.int64(), t.store)
    peaks = []
    for _ in range(3):  # tracemalloc counts every thread's allocations: another thread's (left in this process by
        tracemalloc.start()  # an earlier test of the worker) can add to one window, a copy made by the lookup to all
        try:
            got = lookup_file(f, "pk", want, pa.int64(), t.store)
            peaks.append(tracemalloc.get_traced_memory()[1])
        finally:
            tracemalloc.stop()
        assert got.num_rows == 100 and got.equals(first)
    assert min(peaks) < 128 * 1024, peaks  # joining the touched blocks allocated ~300 KiB


def test_a_damaged_block_on_s3_is_rebuilt_and_the_lookup_right(s3, tmp_path, monkeypatch, caplog):
    import logging

    from msgstream_spark.mirror.write.keyindex import side_path
    from msgstream_spark.mirror.write.layout import lookup_file

    where = Where("s3", tmp_path, s3)
    t, keys = _big_file(where, 5_000, monkeypatch)
    [f] = t.live_files()
    side = side_path(f.path)
    raw = bytearray(t.store.read(side))
    for i in range(len(raw) - 32 * 5_000, len(raw), 4096):  # a byte of every block of the arrays, length kept
        raw[i] ^= 0xFF
    t.store.put(side, bytes(raw))
    _forget(tmp_path / "cache", monkeypatch)
    want = pa.array(sorted(int(k) for k in keys[-50:]), pa.int64())
    with caplog.at_level(logging.WARNING):
        got = lookup_file(f, "pk", want, pa.int64(), t.store)
    assert got.num_rows == 50 and "does not match its data file" in caplog.text
    _forget(tmp_path / "cache2", monkeypatch)
    assert lookup_file(f, "pk", want, pa.int64(), t.store).num_rows == 50  # the rebuilt side file


def test_a_damaged_block_on_s3_is_caught_only_by_a_lookup_that_reads_it(s3, tmp_path, monkeypatch, caplog):
    """A new executor checks each block it fetches, not the side file: a byte flipped in a keys block no key of
    the lookup falls in is never fetched nor noticed (the rows right, no warning); a lookup of keys in that
    block catches it, logs it naming the side file, rebuilds it and answers right."""
    import logging

    import numpy as np

    from msgstream_spark.mirror.write.keyindex import side_path
    from msgstream_spark.mirror.write.layout import lookup_file

    where = Where("s3", tmp_path, s3)
    t, keys = _big_file(where, 5_000, monkeypatch)  # 4 KiB blocks: keys blocks 0-9
    [f] = t.live_files()
    side = side_path(f.path)
    raw = bytearray(t.store.read(side))
    raw[len(raw) - 32 * 5_000 + 5 * 4096 + 8] ^= 0xFF  # keys block 5: sorted rows 2,560-3,071
    t.store.put(side, bytes(raw))
    ordered = np.sort(keys)
    low, mid = pa.array(ordered[:3].tolist(), pa.int64()), pa.array(ordered[2600:2603].tolist(), pa.int64())
    _forget(tmp_path / "cache", monkeypatch)
    with caplog.at_level(logging.WARNING):
        assert sorted(lookup_file(f, "pk", low, pa.int64(), t.store).column("key").to_pylist()) == low.to_pylist()
    assert caplog.text == "" and t.store.read(side) == bytes(raw)
    _forget(tmp_path / "cache2", monkeypatch)
    with caplog.at_level(logging.WARNING):
        assert sorted(lookup_file(f, "pk", mid, pa.int64(), t.store).column("key").to_pylist()) == mid.to_pylist()
    assert f"the key index {side} does not match its data file" in caplog.text and t.store.read(side) != bytes(raw)


def test_a_damaged_copy_in_the_block_cache_is_fetched_again(s3, tmp_path, monkeypatch, caplog):
    """A unit of the executor's block cache whose bytes changed on its disk is caught when a new worker first
    reads it (its blocks' CRC-32), logged, fetched again from the store and the lookup answered right; the side
    file on the store, which is right, is not rebuilt."""
    import logging

    import numpy as np

    from msgstream_spark.mirror.write.keyindex import side_path
    from msgstream_spark.mirror.write.layout import lookup_file

    where = Where("s3", tmp_path, s3)
    t, keys = _big_file(where, 5_000, monkeypatch)
    [f] = t.live_files()
    side = t.store.read(side_path(f.path))
    want = pa.array(np.sort(keys)[:3].tolist(), pa.int64())
    cache = tmp_path / "cache"
    _forget(cache, monkeypatch)
    lookup_file(f, "pk", want, pa.int64(), t.store)
    units = {u: u.read_bytes() for u in sorted(cache.glob("*.blk"))}
    assert units
    for u, good in units.items():  # every cached unit damaged on the executor's disk, its length kept
        u.write_bytes(good[:8] + bytes([good[8] ^ 0xFF]) + good[9:])
    _forget()  # a new worker on the same executor
    with caplog.at_level(logging.WARNING):
        got = lookup_file(f, "pk", want, pa.int64(), t.store)
    assert sorted(got.column("key").to_pylist()) == want.to_pylist()
    assert "key index cache block" in caplog.text and "does not match its data file" not in caplog.text
    assert t.store.read(side_path(f.path)) == side
    assert all(u.read_bytes() == good for u, good in units.items())  # the right bytes cached again


def test_a_compaction_beside_a_running_job_is_refused_on_the_store(where):
    """The job holds the table's lease on its store for its run: ``msgstream mirror compact`` (another process)
    is refused naming it, with no secret in its output; after the job, it compacts. A bad storage option is an
    error naming the option."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    from msgstream_spark.mirror.store.writer import writer_lock
    from tests.fixtures.s3_server import SECRET_KEY

    t = _open(where)
    fill(t, mixed_batches(3))
    root = Path(__file__).resolve().parents[2]
    opts = [f"--storage-option={k}={v}" for k, v in (where.opts or {}).items()]

    def compact_cli(*more: str) -> subprocess.CompletedProcess:
        proc = subprocess.run([sys.executable, "-m", "msgstream_spark", "mirror", "compact", "--table",
                               where.uri("t"), *opts, *more], env=dict(os.environ, PYTHONPATH=str(root)), cwd=root,
                              timeout=300, capture_output=True, text=True)
        assert SECRET_KEY not in proc.stdout + proc.stderr
        return proc

    with writer_lock(t.store, t.location, "the mirror job"):
        proc = compact_cli()
    assert proc.returncode == 1, proc.stderr[-2000:]
    assert f"being written by another writer (pid {os.getpid()} on " in proc.stderr
    assert "the mirror job); the compaction refused" in proc.stderr
    assert len(t.live_files()) > 1
    assert compact_cli().returncode == 0 and len(_open(where, create=False).live_files()) == 1
    if where.s3 is not None:
        bad = compact_cli("--storage-option", "aws_no_such_key=1")
        assert bad.returncode != 0 and "'aws_no_such_key' is not a setting of s3 storage" in bad.stderr


def test_sparks_checkpoint_stays_on_the_drivers_disk():
    """A table in object storage takes --checkpoint DIR (Spark's checkpoint and the mirror's reads of it are the
    driver's local file system); a checkpoint URI is refused naming the flag; a local table keeps its default."""
    from argparse import Namespace

    from msgstream_spark.cli.table_args import checkpoint_of
    from msgstream_spark.cli.vocab import UsageError

    with pytest.raises(UsageError, match=r"--table s3://b/t is in object storage: pass --checkpoint DIR"):
        checkpoint_of(Namespace(table="s3://b/t", checkpoint=None), required=True)
    assert checkpoint_of(Namespace(table="s3://b/t", checkpoint=None)) is None  # status, verify: none needed
    assert checkpoint_of(Namespace(table="s3://b/t", checkpoint="ck/t"), required=True) == "ck/t"
    with pytest.raises(UsageError, match=r"--checkpoint s3a://b/ck: Spark's checkpoint is a directory on the driver"):
        checkpoint_of(Namespace(table="s3://b/t", checkpoint="s3a://b/ck"), required=True)
    assert checkpoint_of(Namespace(table="lake/t/", checkpoint=None), required=True) == "lake/t_checkpoint"


def test_a_delta_table_whose_log_cannot_be_listed_is_named_in_the_error(s3):
    """delta-rs's listing of ``_delta_log/`` fails (no such bucket): the error is the mirror's, naming the table's
    location, no secret in it (it was a bare OSError without the location)."""
    from tests.fixtures.s3_server import SECRET_KEY

    loc = "s3://no-such-bucket-for-a-table/lake/t"
    for call in (lambda: open_table("delta", loc, collection="c", pk="pk", arrow_schema=pa.schema(
                     [pa.field("pk", pa.int64())]), storage_options=s3.options()),
                 lambda: open_table("delta", loc, collection="c", pk="pk", create=False, storage_options=s3.options())):
        with pytest.raises(MirrorError, match=f"Delta table at {loc}: listing its log") as e:
            call()
        assert SECRET_KEY not in str(e.value)
