"""Plain readers on the S3 server with the option sets docs/mirror.md lists (what #37's phase 2 reader tests
reuse): a Delta table written by deltalake onto the server (it commits each version with ``If-None-Match: *``,
no lock, no unsafe rename) is read by deltalake, Polars and DuckDB's delta extension; an Iceberg table written by
pyiceberg into a warehouse on the server is read by Polars and DuckDB's iceberg extension."""

from __future__ import annotations

import pyarrow as pa

from msgstream_spark.mirror.store.settings import for_pyiceberg
from tests.fixtures.plain_readers import duckdb_on_s3

ROWS = pa.table({"pk": pa.array(range(1, 7), pa.int64()), "name": pa.array(list("abcdef"))})
WANT = [(1, "a"), (3, "c"), (4, "d"), (5, "e"), (6, "f")]


def test_a_delta_table_on_s3_read_by_deltalake_polars_and_duckdb(s3):
    import deltalake
    import polars as pl

    uri = s3.uri("lake", "books")
    opts = s3.options()
    deltalake.write_deltalake(uri, ROWS.slice(0, 3), storage_options=opts)
    deltalake.write_deltalake(uri, ROWS.slice(3), storage_options=opts, mode="append")
    dt = deltalake.DeltaTable(uri, storage_options=opts)
    dt.delete("pk = 2")
    keys = {o["Key"] for o in s3.server.boto3().list_objects_v2(Bucket=s3.bucket)["Contents"]}
    assert {f"lake/books/_delta_log/{v:020d}.json" for v in range(3)} <= keys

    got = deltalake.DeltaTable(uri, storage_options=opts).to_pyarrow_table().sort_by("pk")
    assert list(zip(got.column("pk").to_pylist(), got.column("name").to_pylist())) == WANT
    df = pl.read_delta(uri, storage_options=opts).sort("pk")
    assert list(df.iter_rows()) == WANT
    con = duckdb_on_s3(opts)
    assert con.execute(f"SELECT pk, name FROM delta_scan('{uri}') ORDER BY pk").fetchall() == WANT


def test_an_iceberg_table_on_s3_read_by_polars_and_duckdb(s3, tmp_path, monkeypatch):
    import polars as pl

    monkeypatch.setenv("POLARS_ICEBERG_PLANNER", "pyiceberg")  # polars_iceberg (its faster planner) not installed
    from pyiceberg.catalog import load_catalog

    opts = s3.options()
    cat = load_catalog("lake", type="sql", uri=f"sqlite:///{tmp_path / 'catalog.db'}", **for_pyiceberg(opts))
    cat.create_namespace("msgstream")
    tbl = cat.create_table(("msgstream", "books"), schema=ROWS.schema, location=s3.uri("lake", "books"))
    tbl.append(ROWS)
    tbl.delete("pk = 2")
    tbl = cat.load_table(("msgstream", "books"))
    meta = tbl.metadata_location
    assert meta.startswith(f"s3://{s3.bucket}/lake/books/metadata/")

    assert list(pl.scan_iceberg(tbl, storage_options=opts).collect().sort("pk").iter_rows()) == WANT
    assert list(pl.scan_iceberg(meta, storage_options=for_pyiceberg(opts)).collect().sort("pk").iter_rows()) == WANT
    con = duckdb_on_s3(opts, ("httpfs", "avro", "iceberg"))
    assert con.execute(f"SELECT pk, name FROM iceberg_scan('{meta}') ORDER BY pk").fetchall() == WANT
