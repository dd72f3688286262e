"""Compaction, orphaned files and vacuum of the merge-on-read tables, with kills at each step of the protocol:
the table equals the model after each, no file is referenced twice, orphans are listed and removed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from msgstream_spark.mirror import apply_batch, open_table
from msgstream_spark.mirror.maintenance import compact, orphans, vacuum
from msgstream_spark.mirror.write.layout import write_changes
from tests.mirror.changes import FIELDS, delete, fill, insert, mixed_batches, model, table_state, to_arrow, upsert
from tests.mirror.writers import staged_files

FORMATS = ["delta", "iceberg", "lance"]
# the mirror's own compaction (Lance compacts by its compact_files: tests/mirror/test_lance.py; a fragment that
# loses every row leaves the table at once, where Delta and Iceberg keep a file with every row deleted)
OWN_COMPACTION = ["delta", "iceberg"]
ROOT = Path(__file__).resolve().parents[2]


def _open(fmt, loc):
    return open_table(fmt, str(loc), collection="coll", pk="pk", arrow_schema=FIELDS)


def _no_file_twice(t) -> None:
    paths = [f.path for f in t.live_files()]
    assert len(paths) == len(set(paths))


@pytest.mark.parametrize("fmt", OWN_COMPACTION)
def test_compaction_folds_deletes_and_small_files_away(fmt, tmp_path):
    t = _open(fmt, tmp_path / "t")
    seen = fill(t, mixed_batches(6))
    before = t.live_files()
    assert any(len(f.deleted) for f in before) and len(before) > 2
    done = compact(t)
    assert done.files_in == len(before) and done.files_out == 1 and done.deleted_rows > 0
    after = t.live_files()
    assert len(after) == 1 and not len(after[0].deleted)
    assert table_state(t.to_arrow()) == model(seen)
    assert compact(t).files_in == 0  # nothing left: compaction applies once
    more = mixed_batches(8)[6:]
    for i, b in enumerate(more):  # the stream goes on after a compaction
        assert apply_batch(t, to_arrow(b), "pk", "q", 6 + i)
    assert table_state(_open(fmt, tmp_path / "t").to_arrow()) == model(seen + [m for b in more for m in b])
    _no_file_twice(t)


@pytest.mark.parametrize("fmt", FORMATS)
def test_files_of_a_batch_killed_before_its_commit_are_orphans(fmt, tmp_path):
    """Tasks wrote a batch's files, the driver died before the table commit: nothing reads them, ``orphans``
    lists them, the batch applies on the rerun and ``vacuum`` removes them."""
    t = _open(fmt, tmp_path / "t")
    seen = fill(t, mixed_batches(2))
    lost = to_arrow([insert(99, (1, "lost"), (77, "new"))])
    narrow = write_changes(lost, t.write_spec())  # what the tasks did before the kill
    written = staged_files(t, sorted(set(narrow.column("_file").drop_null().to_pylist())))
    assert written and orphans(t) == written
    t = _open(fmt, tmp_path / "t")  # the restarted driver
    assert t.last_batch("q") == 1
    assert apply_batch(t, lost, "pk", "q", 2)
    assert table_state(t.to_arrow()) == model(seen + [insert(99, (1, "lost"), (77, "new"))])
    assert orphans(t) == written
    # (and Iceberg's manifest lists and manifests of the snapshots it expired)
    assert [p for p in vacuum(t, retain_s=0) if os.sep + "metadata" + os.sep not in p] == written
    assert orphans(t) == [] and table_state(t.to_arrow()) == model(seen + [insert(99, (1, "lost"), (77, "new"))])


@pytest.mark.parametrize("fmt", OWN_COMPACTION)
def test_a_compaction_killed_before_its_commit_changes_nothing(fmt, tmp_path):
    t = _open(fmt, tmp_path / "t")
    seen = fill(t, mixed_batches(4))
    files = sorted(f.path for f in t.live_files())
    code = ("import sys\nfrom msgstream_spark.mirror import open_table\nfrom msgstream_spark.mirror.maintenance "
            "import compact\nfrom tests.mirror.changes import FIELDS\n"
            "compact(open_table(sys.argv[1], sys.argv[2], collection='coll', pk='pk', arrow_schema=FIELDS))")
    env = dict(os.environ, MSGSTREAM_MIRROR_FAILPOINT="kill-in-compaction", PYTHONPATH=str(ROOT))
    proc = subprocess.run([sys.executable, "-c", code, fmt, str(tmp_path / "t")], env=env, cwd=ROOT, timeout=300,
                          capture_output=True, text=True)
    assert proc.returncode == -9, proc.stderr[-2000:]
    t = _open(fmt, tmp_path / "t")
    assert sorted(f.path for f in t.live_files()) == files
    assert table_state(t.to_arrow()) == model(seen)
    left = [p for p in orphans(t) if p.endswith(".parquet")]  # (and Delta's superseded deletion vectors)
    assert len(left) == 1 and pq.read_metadata(left[0]).num_rows == len(model(seen))
    compact(t)  # the rerun compacts once
    assert table_state(t.to_arrow()) == model(seen) and len(t.live_files()) == 1
    vacuum(t, retain_s=0)
    assert orphans(t) == [] and table_state(t.to_arrow()) == model(seen)
    _no_file_twice(t)


@pytest.mark.slow  # the command in a subprocess, twice: make test runs it, make test-fast does not
@pytest.mark.parametrize("fmt", FORMATS)
def test_the_maintenance_entry_point_compacts_once_and_is_refused_beside_a_writer(fmt, tmp_path):
    import json

    from msgstream_spark.mirror.store.writer import writer_lock

    t = _open(fmt, tmp_path / "t")
    seen = fill(t, mixed_batches(3))
    argv = [sys.executable, "-m", "msgstream_spark", "mirror", "compact", "--table", str(tmp_path / "t"),
            "--table-format", fmt]
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    with writer_lock(t.store, str(tmp_path / "t"), "a test's mirror job"):
        proc = subprocess.run(argv, env=env, cwd=ROOT, timeout=300, capture_output=True, text=True)
    assert proc.returncode == 1 and "being written by another writer (pid" in proc.stderr, proc.stderr[-2000:]
    assert len(t.live_files()) > 1
    proc = subprocess.run(argv, env=env, cwd=ROOT, timeout=300, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert json.loads(proc.stdout)["files_out"] == 1
    assert table_state(_open(fmt, tmp_path / "t").to_arrow()) == model(seen)


def _plain_read(fmt, loc) -> dict:
    """The table through delta-rs's DataFusion scan / pyiceberg's scan, not this project's table code."""
    import pyarrow as pa

    if fmt == "delta":
        import deltalake

        dt = deltalake.DeltaTable(loc)
        got = pa.table(deltalake.QueryBuilder().register("t", dt).execute("SELECT * FROM t").read_all())
        return table_state(got.cast(pa.schema([f.with_type(pa.string()) if pa.types.is_string_view(f.type) else f
                                               for f in got.schema])))
    from pyiceberg.catalog.sql import SqlCatalog

    cat = SqlCatalog("msgstream", uri=f"sqlite:///{loc}_catalog.sqlite", warehouse=f"file://{loc}")
    return table_state(cat.load_table(("msgstream", "coll")).scan().to_arrow())


# (killed before the commit with the files complete: test_a_compaction_killed_before_its_commit_changes_nothing)
@pytest.mark.slow  # a process fault: the command SIGKILLed in a subprocess and run again
@pytest.mark.parametrize(("fmt", "step"), [
    ("delta", "kill-in-compaction-write"), ("iceberg", "kill-in-compaction-write"),
    ("iceberg", "kill-after-compaction-commit")])
def test_msgstream_mirror_compact_sigkilled_then_rerun(fmt, step, tmp_path):
    """``msgstream mirror compact`` SIGKILLed while writing its files, before its commit, after it: the killed
    process's writer lease does not hold up the re-run (its holder is seen dead on this machine and the lease is
    taken over at once; the lease is left with the dead pid in it), the re-run compacts once, the table equals
    the model before and after, no file is referenced twice, the killed run's half-written file was never
    published (a temporary file, listed as an orphan once old, removed by vacuum)."""
    import json
    from types import SimpleNamespace

    from msgstream_spark.mirror.maintenance import FAILPOINT_ENV
    from msgstream_spark.mirror.store.lease import LEASE_NAME

    loc = str(tmp_path / "t")
    seen = fill(_open(fmt, loc), mixed_batches(4))
    want = model(seen)
    files = sorted(f.path for f in _open(fmt, loc).live_files())
    assert _plain_read(fmt, loc) == want and len(files) > 1

    def compact_cli(**env) -> SimpleNamespace:
        proc = subprocess.Popen([sys.executable, "-m", "msgstream_spark", "mirror", "compact", "--table", loc,
                                 "--table-format", fmt], env=dict(os.environ, PYTHONPATH=str(ROOT), **env), cwd=ROOT,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        out, err = proc.communicate(timeout=300)
        return SimpleNamespace(pid=proc.pid, returncode=proc.returncode, stdout=out, stderr=err)

    proc = compact_cli(**{FAILPOINT_ENV: step})
    assert proc.returncode == -9, proc.stderr[-2000:]
    lease = json.loads((tmp_path / "t" / LEASE_NAME).read_text())
    assert lease["pid"] == proc.pid and "mirror compact" in lease["command"]  # the dead holder's record stays
    assert lease["expires"] > time.time()  # unexpired: only its holder's death lets the re-run in
    committed = step == "kill-after-compaction-commit"
    t = _open(fmt, loc)
    live = [f.path for f in t.live_files()]
    assert (sorted(live) == files) is not committed and _plain_read(fmt, loc) == want
    assert not [p for p in orphans(t) if p.endswith(".parquet")]  # a killed writer publishes no data file
    killed = [os.path.join(d, n) for d, _, ns in os.walk(os.path.join(loc, "data")) for n in ns if n.endswith(".tmp")]
    assert len(killed) == (0 if committed else 1)  # its half-written file stayed a temporary one (local store)
    for p in killed:  # an hour later it is listed as an orphan (never a live writer's in-flight file)
        os.utime(p, (time.time() - 7200, time.time() - 7200))
    assert sorted(p for p in orphans(t) if p.endswith(".tmp")) == sorted(killed)

    proc = compact_cli()  # the re-run: not refused by the dead process's lock; compacts once
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert (json.loads(proc.stdout)["files_in"] == 0) is committed
    t = _open(fmt, loc)
    after = [f.path for f in t.live_files()]
    assert len(after) == 1 and not any(len(f.deleted) for f in t.live_files())
    assert _plain_read(fmt, loc) == want
    assert compact(t).files_in == 0  # nothing left: exactly once

    vacuum(t, retain_s=0)
    assert not any(os.path.exists(p) for p in killed + files)  # the killed run's and the compacted-away files
    assert orphans(t) == [] and _plain_read(fmt, loc) == want


def _partitioned_iceberg(loc: str):
    """An Iceberg mirror table a user partitioned by identity on ``_partition`` (Milvus's partition id)."""
    from pyiceberg.transforms import IdentityTransform

    from msgstream_spark.mirror.common import identity_properties, table_schema
    from msgstream_spark.mirror.formats.iceberg.catalog import _catalog, _identifier

    tbl = _catalog(loc, None).create_table(_identifier("coll"), schema=table_schema(FIELDS, "pk"), location=loc,
                                           properties=identity_properties("coll", "pk", None))
    with tbl.update_spec() as spec:
        spec.add_field("_partition", IdentityTransform(), "part")
    return _open("iceberg", loc)


def _two_partitions(k: int) -> list:
    """Batches of keys 0-19 in Milvus partition 1 and 20-39 in partition 2: (messages, partition) pairs."""
    out = [([insert(10, *[(p, f"a{p}") for p in range(20)])], 1),
           ([insert(10, *[(p, f"a{p}") for p in range(20, 40)])], 2)]
    for i in range(1, k):
        ts = 10 + 10 * i
        out.append(([*upsert(ts, *[(p, f"u{i}.{p}") for p in range(i % 4, 20, 4)]), delete(ts + 1, i)], 1))
        out.append(([*upsert(ts, *[(p, f"u{i}.{p}") for p in range(20 + i % 4, 40, 4)]), delete(ts + 1, 20 + i)], 2))
    return out


def test_compaction_of_a_partitioned_iceberg_table_writes_a_file_per_partition(tmp_path):
    """#38 item 4: the batch writer splits by the table's identity partition; compaction did not (pyiceberg
    refused its files of two partition values): each partition's files compact into files of that value."""
    loc = str(tmp_path / "t")
    t = _partitioned_iceberg(loc)
    seen = []
    for i, (msgs, part) in enumerate(_two_partitions(4)):
        assert apply_batch(t, to_arrow(msgs, partition=part), "pk", "q", i)
        seen += msgs
    before = t.live_files()
    assert len({f.partition for f in before}) == 2 and any(len(f.deleted) for f in before)
    done = compact(t)
    assert done.files_in == len(before) and done.files_out == 2
    after = t.live_files()
    assert len(after) == 2 and not any(len(f.deleted) for f in after)
    for f in after:  # one partition value per file, the rows of that partition
        parts = set(pq.read_table(f.path, columns=["_partition"]).column(0).to_pylist())
        assert parts == {f.partition[0]}
    assert table_state(t.to_arrow()) == model(seen) == _plain_read("iceberg", loc)
    assert compact(t).files_in == 0


def test_compact_every_of_a_partitioned_iceberg_table_through_mirror_batch(spark, tmp_path):
    """``--compact-every 2`` (MirrorBatch's compact_every) on a partitioned Iceberg table: the Spark path's
    batches and their compactions; the query lives and the table equals the model."""
    from msgstream_spark.spark.mirror import MirrorBatch

    loc = str(tmp_path / "t")
    t = _partitioned_iceberg(loc)
    sink = MirrorBatch(t, "pk", query_id="q", compact_every=2)
    seen = []
    for i, (msgs, part) in enumerate(_two_partitions(3)):
        sink(spark.createDataFrame(to_arrow(msgs, partition=part)), i)
        seen += msgs
    assert sink.batches == 6 and sink.compactions == 3
    assert table_state(_open("iceberg", loc).to_arrow()) == model(seen) == _plain_read("iceberg", loc)
    assert {f.partition[0] for f in t.live_files()} == {1, 2}


@pytest.mark.parametrize("fmt", FORMATS)
def test_leftover_temporary_files_of_killed_writers_are_orphans_once_old(fmt, tmp_path):
    """#38 item 7: a kill inside a Delta commit leaves ``_delta_log/.N.json.<id>.tmp``, inside a key index's
    write ``data/_keys/<file>.keys.<id>.tmp``: listed and removed once older than the temporary-file bound (a
    live writer's in-flight temporary file, fresh, never)."""
    from msgstream_spark.mirror.maintenance import TMP_MIN_AGE_S

    loc = tmp_path / "t"
    t = _open(fmt, loc)
    seen = fill(t, mixed_batches(3))
    data = next(iter(t.live_files())).path
    keys_dir = os.path.join(os.path.dirname(data), "_keys")
    os.makedirs(keys_dir, exist_ok=True)
    old, fresh = [os.path.join(keys_dir, f"{os.path.basename(data)}.keys.{'a' * 32}.tmp")], \
        [os.path.join(keys_dir, f"{os.path.basename(data)}.keys.{'b' * 32}.tmp")]
    if fmt == "delta":
        old.append(str(loc / "_delta_log" / f".{3:020d}.json.{'c' * 32}.tmp"))
        fresh.append(str(loc / "_delta_log" / f".{3:020d}.json.{'d' * 32}.tmp"))
    for p in old + fresh:
        with open(p, "w") as f:
            f.write("{}")
    for p in old:
        os.utime(p, (os.path.getmtime(p) - TMP_MIN_AGE_S - 60,) * 2)
    tmps = [p for p in orphans(t) if p.endswith(".tmp")]  # (and Delta's superseded deletion vectors)
    assert tmps == sorted(old)
    assert set(old) <= set(vacuum(t, retain_s=0))
    assert not any(os.path.exists(p) for p in old) and all(os.path.exists(p) for p in fresh)
    assert orphans(t) == [] and table_state(_open(fmt, loc).to_arrow()) == model(seen)


def test_iceberg_compaction_commits_a_replace_snapshot(tmp_path):
    """#38 item 7: compaction changes no row: its snapshot's operation is ``replace``, with the totals right."""
    t = _open("iceberg", tmp_path / "t")
    seen = fill(t, mixed_batches(4))
    compact(t)
    snap = t._table().current_snapshot()
    assert snap.summary.operation.value == "replace"
    assert snap.summary["total-delete-files"] == "0" and snap.summary["total-data-files"] == "1"
    assert int(snap.summary["total-records"]) == len(model(seen))
    assert _plain_read("iceberg", str(tmp_path / "t")) == model(seen)


def test_iceberg_re_snapshot_drops_the_old_position_delete_files(tmp_path):
    """#38 item 7: replace_files (a re-snapshot) removes every data file and every position-delete file: the
    new snapshot carries none of the old delete files (vacuum can remove them once expired)."""
    from msgstream_spark.mirror.common import conform

    loc = tmp_path / "t"
    t = _open("iceberg", loc)
    seen = fill(t, mixed_batches(3))
    tbl = t._table()
    assert len(tbl.inspect.delete_files()) > 0
    rows = conform(t.to_arrow(), t.write_spec().schema)
    path = str(loc / "snapshot-1" / "part-0.parquet")
    os.makedirs(os.path.dirname(path))
    pq.write_table(rows.cast(t.schema), path)
    t.replace_files([path], properties={"msgstream.snapshot_ts": "1000"})
    tbl = _open("iceberg", loc)._table()
    assert tbl.inspect.delete_files().num_rows == 0
    assert tbl.inspect.files().column("file_path").to_pylist() == [f"file://{path}"] or \
        tbl.inspect.files().column("file_path").to_pylist() == [path]
    assert table_state(tbl.scan().to_arrow()) == model(seen)
