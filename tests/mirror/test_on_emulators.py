"""Delta and Iceberg mirror tables on the emulated object stores, Spark-free (the emulators:
tests/fixtures/emulators.py; what each enforces of a conditional put: tests/mirror/store/test_emulators.py).

On Azurite (``az://``): batches committed by put-if-absent under the writer lease, read back by delta-rs and
Polars with the same storage options; two writers racing for one version, one wins; an Iceberg table at
``abfs://`` read back by plain pyiceberg. None on
gcp-storage-emulator (``gs://``): it answers neither obstore's uploads nor its listings (test_emulators.py)."""

from __future__ import annotations

import pyarrow as pa

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror import open_table
from msgstream_spark.mirror.store import open_store
from msgstream_spark.mirror.write.batch import lookup_local
from msgstream_spark.mirror.write.layout import plan, write_changes
from tests.fixtures.emulators import Bucket
from tests.mirror.changes import FIELDS, fill, insert, mixed_batches, model, table_state, to_arrow
from tests.mirror.store.racing import race


def _open(bucket, create: bool = True):
    return open_table("delta", bucket.uri("lake", "t"), collection="coll", pk="pk",
                      arrow_schema=FIELDS if create else None, create=create, storage_options=bucket.options())


def test_batches_on_azurite_are_what_delta_rs_and_polars_read(azure):
    import deltalake
    import polars as pl

    t = _open(azure)
    seen = fill(t, mixed_batches(4))
    want = model(seen)
    assert table_state(t.to_arrow()) == want
    loc, so = azure.uri("lake", "t"), azure.options()
    dt = deltalake.DeltaTable(loc, storage_options=so)
    assert dt.version() == 4
    rs = pa.table(deltalake.QueryBuilder().register("t", dt).execute("SELECT * FROM t").read_all())
    rs = rs.cast(pa.schema([f.with_type(pa.string()) if pa.types.is_string_view(f.type) else f for f in rs.schema]))
    assert table_state(rs) == want
    assert table_state(pl.read_delta(loc, storage_options=so).to_arrow()) == want
    names = {m.uri.removeprefix(loc + "/") for m in open_store(loc, so, env={}).list(loc)}
    assert {"_delta_log/00000000000000000004.json", "_msgstream_writer.lease"} <= names


def test_two_writers_racing_for_one_version_on_azurite_one_wins(azure):
    """Two handles plan a batch on one version and publish at once, no lease between them: Azurite refuses the
    second ``If-None-Match: *`` create of the version, so one commits and the other commits nothing."""
    t = _open(azure)
    seen = fill(t, mixed_batches(1))
    writers, plans = [_open(azure, create=False) for _ in range(2)], []
    for i, w in enumerate(writers):
        narrow = write_changes(to_arrow([insert(100 + i, (1, f"w{i}"), (50 + i, f"n{i}"))]), w.write_spec())
        files = w.live_files()
        plans.append(plan(narrow, lookup_local(w, narrow.column("key").combine_chunks(), files), files.version))
    won, lost = race([lambda i=i: (writers[i].commit(plans[i], query_id=f"w{i}", batch_id=0), i)[1]
                      for i in range(2)], MirrorError)
    assert len(won) == 1 and len(lost) == 1
    assert "was written by another writer meanwhile; nothing committed" in str(lost[0])
    i = won[0]
    assert table_state(_open(azure, create=False).to_arrow()) == model(seen + [insert(100 + i, (1, f"w{i}"),
                                                                                      (50 + i, f"n{i}"))])



def test_an_iceberg_mirror_on_azurite_is_what_pyiceberg_reads(azure, tmp_path, monkeypatch):
    """An Iceberg table at ``abfs://container/...`` (data files through the store, metadata through pyiceberg's
    FileIO configured from the same settings: pyarrow's AzureFileSystem on Azurite), its SQL catalog on SQLite,
    read back by a plain pyiceberg catalog given the same settings (under the name the catalog keeps its rows by)."""
    from pyiceberg.catalog import load_catalog

    from msgstream_spark.mirror.store.settings import for_pyiceberg

    monkeypatch.setenv("PYICEBERG_HOME", str(tmp_path))  # no .pyiceberg.yaml of the machine's user
    abfs = Bucket("abfs", azure.server, azure.name)
    loc, db = abfs.uri("lake", "books"), f"sqlite:///{tmp_path}/catalog.sqlite"
    t = open_table("iceberg", loc, collection="coll", pk="pk", arrow_schema=FIELDS, catalog_uri=db,
                   storage_options=abfs.options())
    seen = fill(t, mixed_batches(3))
    want = model(seen)
    assert table_state(t.to_arrow()) == want
    plain = load_catalog("msgstream", type="sql", uri=db, **for_pyiceberg(abfs.options()))\
        .load_table(("msgstream", "coll"))
    assert plain.metadata_location.startswith(loc + "/metadata/")
    assert table_state(plain.scan().to_arrow()) == want
    names = {m.uri.removeprefix(loc + "/") for m in open_store(loc, abfs.options(), env={}).list(loc)}
    assert any(n.startswith("metadata/") and n.endswith(".metadata.json") for n in names)
    assert any(n.startswith("data/") for n in names)
