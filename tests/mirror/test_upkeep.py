"""Maintenance inside the job (mirror.upkeep on mirror.policy): after many batches a table keeps a bounded
history (snapshots / log files, metadata bytes), its rows are the model's, and a reader pinned to a kept
version reads it, on a local directory and on the S3 server."""

from __future__ import annotations

import pyarrow as pa
import pytest

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror import apply_batch
from msgstream_spark.mirror import upkeep as upkeep_mod
from msgstream_spark.mirror.formats import registry
from msgstream_spark.mirror.formats.delta import table as delta_table
from msgstream_spark.mirror.policy import MaintenancePolicy, TableFigures, due, keep_from, parse
from msgstream_spark.mirror.upkeep import Upkeep
from tests.mirror.changes import delete, model, table_state, to_arrow, upsert
from tests.mirror.test_deposed_writer import Place

KEYS = 40
BATCHES = 32
POLICY = {"retain.age": "0", "retain.min": "3", "retain.max": "6", "expire.every": "4", "compact.small-files": "6",
          "compact.deleted-fraction": "0.5", "manifests.max": "4"}


@pytest.fixture(params=["local", "s3"])
def place(request, tmp_path) -> Place:
    return Place(request.param, tmp_path, request.getfixturevalue("s3") if request.param == "s3" else None)


def _batch(i: int) -> list:
    """Batch ``i``: upserts of 5 keys (an insert the first time a key is seen), a delete of another."""
    ts = 10 + 10 * i
    return [*upsert(ts, *[((i * 5 + k) % KEYS, f"v{i}.{k}") for k in range(5)]), delete(ts + 1, (i * 7 + 3) % KEYS)]


def _pinned_read(place: Place, fmt: str, version) -> dict:
    """Version ``version`` read by the format's own library, opened afresh (time travel)."""
    if fmt == "delta":
        import deltalake

        dt = deltalake.DeltaTable(place.loc, version=version, storage_options=place.opts or {})
        got = pa.table(deltalake.QueryBuilder().register("t", dt).execute("SELECT * FROM t").read_all())
        return table_state(got.cast(pa.schema([f.with_type(pa.string()) if pa.types.is_string_view(f.type) else f
                                               for f in got.schema])))
    if fmt == "lance":
        import lance

        from msgstream_spark.mirror.formats.lance.options import dataset_uri

        ds = lance.dataset(dataset_uri(place.loc), version=version,
                           storage_options={**(place.opts or {}), "allow_http": "true"})
        return table_state(ds.to_table())
    from pyiceberg.catalog.sql import SqlCatalog

    from msgstream_spark.mirror.store.settings import for_pyiceberg

    cat = SqlCatalog("msgstream", uri=place.catalog or f"sqlite:///{place.loc}_catalog.sqlite",
                     **for_pyiceberg(place.opts or {}))
    return table_state(cat.load_table(("msgstream", "coll")).scan(snapshot_id=version).to_arrow())


@pytest.mark.parametrize("fmt", ["delta", "iceberg", "lance"])
def test_the_history_stays_bounded_and_a_pinned_reader_reads_its_version(fmt, place, monkeypatch):
    monkeypatch.setattr(delta_table, "CHECKPOINT_EVERY", 5)  # Delta's log is cut at checkpoints (default 100)
    # the vacuum's clock-grain slack keeps the files of the last second too: with batches milliseconds apart (here,
    # not in a job) how many batches that is depends on the machine's speed; the bound is the policy's, so none
    monkeypatch.setattr(upkeep_mod, "RETAIN_SLACK_S", 0.05)
    t = place.open(fmt)
    up = Upkeep(t, parse(POLICY))
    fmts = registry.upkeep(t)
    seen, sizes, pins = [], {}, {}
    for i in range(BATCHES):
        assert apply_batch(t, to_arrow(_batch(i)), "pk", "q", i)
        seen += _batch(i)
        up.after_batch()
        sizes[i] = fmts.figures(t)
        pins[i] = (fmts.versions(t)[-1][0], model(seen))
    assert up.runs["expire"] == BATCHES // 4 and not any(up.errors.values())
    assert up.runs["compact"] >= (3 if fmt != "lance" else 2)  # Lance's compact_files leaves fewer small files
    assert table_state(place.open(fmt, create=False).to_arrow()) == model(seen) == place.read(fmt)
    # bounded: the versions kept, the metadata files and their bytes do not grow with the batches
    # (a sawtooth: the second half's mean against the first's after its first expiries; unbounded, it is 2x)
    for key in ("versions", "metadata_files", "metadata_bytes"):
        first = [s[key] for i, s in sizes.items() if 8 <= i < BATCHES // 2]
        second = [s[key] for i, s in sizes.items() if i >= BATCHES // 2]
        assert sum(second) / len(second) <= 1.25 * sum(first) / len(first), key
    # retain.max + 2 versions (a batch, a compaction) per batch between expiries (+ Delta: to a checkpoint)
    assert max(s["versions"] for s in sizes.values()) <= 6 + 2 * 4 + (2 * 5 if fmt == "delta" else 0)
    # the versions kept (at least retain.min) read as they were committed; an expired one is gone
    kept_versions = [v for v, _ in fmts.versions(t)]
    assert len(kept_versions) >= 3 and pins[BATCHES - 1][0] == kept_versions[-1]
    for version, want in pins.values():
        if version in kept_versions:
            assert _pinned_read(place, fmt, version) == want
    with pytest.raises(Exception):  # noqa: B017 (each library's own error for a version it no longer has)
        _pinned_read(place, fmt, pins[2][0])


@pytest.mark.parametrize("fmt", ["delta", "iceberg", "lance"])
def test_a_reader_pinned_before_maintenance_reads_on_within_the_retention(fmt, tmp_path, monkeypatch):
    """The pinned read the mirror's own verify uses (``registry.pin``), opened before compactions and expiries
    that keep its version (retain.min): it still reads its rows after them."""
    monkeypatch.setattr(delta_table, "CHECKPOINT_EVERY", 5)
    place = Place("local", tmp_path)
    t = place.open(fmt)
    up = Upkeep(t, parse({**POLICY, "retain.min": "40", "retain.max": "40"}))
    seen = []
    for i in range(6):
        assert apply_batch(t, to_arrow(_batch(i)), "pk", "q", i)
        seen += _batch(i)
    pinned, want = registry.pin(t), model(seen)
    for i in range(6, 16):
        assert apply_batch(t, to_arrow(_batch(i)), "pk", "q", i)
        up.after_batch()
    assert up.runs["compact"] >= 1 and up.runs["expire"] >= 2
    got = pa.Table.from_batches(list(pinned.batches()))
    assert table_state(got.cast(pa.schema([f.with_type(pa.string()) if pa.types.is_string_view(f.type) else f
                                           for f in got.schema]))) == want


def test_the_policy_reads_its_options_and_decides():
    p = parse(["compact.every=5", "retain.age=2h", "retain.min=2", "retain.max=4", "enabled=true"])
    assert (p.compact_every, p.retain_age_s, p.retain_min, p.retain_max) == (5, 7200.0, 2, 4)
    assert parse({}).as_options()["retain.max"] == str(MaintenancePolicy().retain_max)
    with pytest.raises(MirrorError, match="unknown key.*compact.every"):
        parse(["compact.evry=5"])
    with pytest.raises(MirrorError, match="retain.age=soon: not a duration"):
        parse(["retain.age=soon"])
    with pytest.raises(MirrorError, match="retain.max"):
        parse(["retain.min=5", "retain.max=2"])
    assert due(p, TableFigures(batches_since_compaction=5)) == ["compact"]
    assert due(p, TableFigures(rows=100, deleted_rows=10)) == ["compact"]  # 10 % deleted
    assert due(p, TableFigures(small_files=32, manifests=101, batches_since_expiry=10)) == [
        "compact", "merge_manifests", "expire"]
    assert due(parse(["enabled=false"]), TableFigures(batches_since_compaction=99, small_files=99)) == []
    now = 1_000_000
    versions = [(v, now - (10 - v) * 1000_000) for v in range(10)]  # one every 1000 s, the last 1000 s ago
    assert keep_from(parse(["retain.age=1h", "retain.min=1", "retain.max=100"]), versions, now) == 6
    assert keep_from(parse(["retain.age=1h", "retain.min=5", "retain.max=100"]), versions, now) == 5
    assert keep_from(parse(["retain.age=10d", "retain.min=1", "retain.max=3"]), versions, now) == 7


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_a_deposed_writers_maintenance_is_refused_by_the_epoch(fmt, tmp_path, monkeypatch):
    """The table holds a later writer's epoch: the history trim (and Iceberg's manifest merge) of a writer
    with a lower one commits and deletes nothing."""
    from msgstream_spark.mirror.store import LeaseLost

    monkeypatch.setattr(delta_table, "CHECKPOINT_EVERY", 5)
    t = Place("local", tmp_path).open(fmt)
    for i in range(12):
        assert apply_batch(t, to_arrow(_batch(i)), "pk", "q", i)
    t.publish_epoch(7)
    fmts = registry.upkeep(t)
    before = fmts.figures(t)
    versions = fmts.versions(t)
    with pytest.raises(LeaseLost, match="epoch 7"):
        fmts.trim(t, versions[-2][0], epoch=3)
    if fmt == "iceberg":
        with pytest.raises(LeaseLost, match="epoch 7"):
            fmts.merge_manifests(t, epoch=3)
    after = fmts.figures(t)
    assert (after["versions"], after["metadata_files"]) == (before["versions"], before["metadata_files"])
    assert fmts.trim(t, versions[-2][0], epoch=7) is not None  # the current writer's passes
