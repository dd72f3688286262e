"""The Iceberg catalog as pyiceberg users configure it: ``--catalog NAME`` from ``.pyiceberg.yaml`` or
``PYICEBERG_CATALOG__<NAME>__*``, ``--catalog-option`` overrides, the storage settings as FileIO properties.
A SQL catalog on a real PostgreSQL server with its warehouse on the S3 server: a table created, appended to and
read back by a separately loaded plain pyiceberg catalog; its metadata, manifests and data files are objects in
the bucket, its pointer a row in PostgreSQL. (A smoke test of the wiring; the mirror's use comes with #37's
phase 2.)"""

from __future__ import annotations

import pyarrow as pa
import pytest

from msgstream_spark.errors import ConfigError
from msgstream_spark.mirror.formats.iceberg.catalog import (
    _catalog_uri,
    catalog_properties,
    ensure_namespace,
    resolve_catalog,
    table_identifier,
)
from tests.fixtures.s3_server import SECRET_KEY

ROWS = pa.table({"pk": pa.array([1, 2, 3], pa.int64()), "name": pa.array(["a", "b", "c"])})


def _env_catalog(monkeypatch, name: str, props: dict[str, str]) -> None:
    for k, v in props.items():
        monkeypatch.setenv(f"PYICEBERG_CATALOG__{name.upper()}__{k.upper().replace('.', '__').replace('-', '_')}", v)


def test_sql_catalog_on_postgresql_with_its_warehouse_on_s3(s3, postgres_db, monkeypatch, tmp_path):
    monkeypatch.setenv("PYICEBERG_HOME", str(tmp_path))  # no .pyiceberg.yaml of the machine's user
    _env_catalog(monkeypatch, "lake", {"type": "sql", "uri": postgres_db, "warehouse": s3.uri("wh")})
    location = s3.uri("lake", "books")
    cat = resolve_catalog(location, name="lake", storage_options=s3.options())
    ident = table_identifier(location)
    assert ident == ("msgstream", "books")
    ensure_namespace(cat, ident)
    tbl = cat.create_table(ident, schema=ROWS.schema, location=location)
    tbl.append(ROWS)
    tbl.append(ROWS.slice(0, 1))

    from pyiceberg.catalog import load_catalog

    plain = load_catalog("lake", type="sql", uri=postgres_db, **{
        "s3.endpoint": s3.endpoint, "s3.access-key-id": s3.options()["aws_access_key_id"],
        "s3.secret-access-key": SECRET_KEY, "s3.region": "us-east-1"})
    back = plain.load_table(ident).scan().to_arrow().sort_by("pk")
    assert back.column("pk").to_pylist() == [1, 1, 2, 3]
    assert back.column("name").to_pylist() == ["a", "a", "b", "c"]

    keys = [o["Key"] for o in s3.server.boto3().list_objects_v2(Bucket=s3.bucket)["Contents"]]
    assert all(k.startswith("lake/books/") for k in keys)
    assert any(k.startswith("lake/books/metadata/") and k.endswith(".metadata.json") for k in keys)
    assert any(k.endswith(".avro") for k in keys)  # manifests and manifest lists
    assert sum(k.startswith("lake/books/data/") and k.endswith(".parquet") for k in keys) == 2

    import psycopg2

    dsn = postgres_db.replace("postgresql+psycopg2://", "postgresql://")
    with psycopg2.connect(dsn) as conn, conn.cursor() as cur:
        cur.execute("SELECT table_namespace, table_name, metadata_location FROM iceberg_tables")
        [(ns, name, metadata)] = cur.fetchall()
    assert (ns, name) == ident and metadata == plain.load_table(ident).metadata_location
    assert metadata.startswith(f"s3://{s3.bucket}/lake/books/metadata/")


def test_a_catalog_from_pyiceberg_yaml_with_catalog_options_over_it(s3, monkeypatch, tmp_path):
    (tmp_path / ".pyiceberg.yaml").write_text(
        "catalog:\n  lake:\n    type: sql\n    uri: sqlite:///" + str(tmp_path / "wrong.db") + "\n"
        f"    s3.endpoint: {s3.endpoint}\n")
    monkeypatch.setenv("PYICEBERG_HOME", str(tmp_path))
    props = catalog_properties("lake", {"uri": f"sqlite:///{tmp_path / 'cat.db'}"},
                               {"s3.endpoint": "http://ignored:1", "s3.access-key-id": "AK"})
    assert props["uri"] == f"sqlite:///{tmp_path / 'cat.db'}"  # --catalog-option wins
    assert props["s3.endpoint"] == s3.endpoint  # the catalog's own FileIO setting wins over the storage's
    assert props["s3.access-key-id"] == "AK"  # the storage's fills what the catalog leaves out
    location = s3.uri("t", "books")
    cat = resolve_catalog(location, name="lake", options={"uri": f"sqlite:///{tmp_path / 'cat.db'}"},
                          storage_options=s3.options())
    ident = table_identifier(location, "lake.shelf.books")
    ensure_namespace(cat, ident)
    cat.create_table(ident, schema=ROWS.schema, location=location).append(ROWS)
    assert cat.load_table(ident).scan().to_arrow().num_rows == 3
    assert (tmp_path / "cat.db").exists() and not (tmp_path / "wrong.db").exists()


def test_errors_name_the_catalog_and_hide_secrets(s3, monkeypatch, tmp_path):
    monkeypatch.setenv("PYICEBERG_HOME", str(tmp_path))
    with pytest.raises(ConfigError, match="'nolake' is not configured.*PYICEBERG_CATALOG__NOLAKE__"):
        resolve_catalog(s3.uri("t"), name="nolake", storage_options=s3.options())
    with pytest.raises(ConfigError, match="needs|--catalog NAME"):
        resolve_catalog(s3.uri("t"), storage_options=s3.options())
    with pytest.raises(ConfigError) as e:  # a catalog type pyiceberg cannot build quotes its properties
        resolve_catalog(s3.uri("t"), name="bad", options={"type": "nosuchtype", "uri": "postgresql://u:pw-xyz@h/db"},
                        storage_options=s3.options())
    assert "'bad'" in str(e.value) and SECRET_KEY not in str(e.value) and "pw-xyz" not in str(e.value)


def test_the_default_stays_sqlite_beside_a_local_table(tmp_path):
    loc = str(tmp_path / "books")
    assert resolve_catalog(loc, create=False) is None  # no table yet, nothing created
    cat = resolve_catalog(loc)
    assert cat.properties["uri"] == _catalog_uri(loc, None) == f"sqlite:///{loc}_catalog.sqlite"
    assert table_identifier(loc) == ("msgstream", "books")
    assert table_identifier("s3://b/lake/my-books/") == ("msgstream", "my_books")
    assert table_identifier("s3://b/x", "a.b.t") == ("a", "b", "t")
    with pytest.raises(ConfigError, match="namespace.table"):
        table_identifier("s3://b/x", "justname")


def test_a_table_in_the_store_created_in_a_new_sql_catalog_file(s3, tmp_path):
    """``--table s3://... --catalog-uri sqlite:///new.db``: the default namespace is made with the table (a new
    catalog file has none; the table's creation failed with NoSuchNamespaceError), and a plain pyiceberg catalog
    on that file finds the table at its location in the bucket."""
    from pyiceberg.catalog.sql import SqlCatalog

    from msgstream_spark.mirror import open_table

    location, cat_uri = s3.uri("lake", "books"), f"sqlite:///{tmp_path / 'new.db'}"
    t = open_table("iceberg", location, collection="books", pk="pk", arrow_schema=ROWS.schema, create=True,
                   catalog_uri=cat_uri, storage_options=s3.options())
    assert t.location == location
    plain = SqlCatalog("msgstream", uri=cat_uri, **{
        "s3.endpoint": s3.endpoint, "s3.access-key-id": s3.options()["aws_access_key_id"],
        "s3.secret-access-key": SECRET_KEY, "s3.region": "us-east-1"})
    assert plain.list_tables("msgstream") == [("msgstream", "books")]
    assert plain.load_table(("msgstream", "books")).location().rstrip("/") == location.rstrip("/")


def test_the_file_io_of_a_gs_and_an_abfs_table_carries_the_store_settings(monkeypatch, tmp_path):
    """pyiceberg's FileIO for a ``gs://`` and an ``abfs://`` table is configured from the table's storage settings
    (the ``gcs.*`` and ``adls.*`` properties), and the pyarrow file system it builds for the location uses them:
    the endpoint, the credentials (a GCS bearer token: ``gcs.oauth2.token``; an Azure account and key)."""
    import json

    monkeypatch.setenv("PYICEBERG_HOME", str(tmp_path))  # no .pyiceberg.yaml of the machine's user
    key = json.dumps({"type": "service_account", "project_id": "lake-project", "private_key": "k"})
    gcs = resolve_catalog("gs://bkt/lake/t", catalog_uri=f"sqlite:///{tmp_path / 'g.db'}", storage_options={
        "base_url": "http://127.0.0.1:4443", "bearer_token": "ya29.token", "service_account_key": key})
    io = gcs._load_file_io(location="gs://bkt/lake/t")
    want = {"gcs.service.host": "http://127.0.0.1:4443", "gcs.oauth2.token": "ya29.token",
            "gcs.project-id": "lake-project"}
    assert {k: io.properties.get(k) for k in want} == want
    made = io.fs_by_scheme("gs", "bkt").__reduce__()[1][0]
    assert (made["scheme"], made["endpoint_override"], made["access_token"]) == ("http", "127.0.0.1:4443", "ya29.token")
    assert made["credential_token_expiration"] is not None  # pyarrow takes a token only with its expiry

    az = resolve_catalog("abfs://cont/lake/t", catalog_uri=f"sqlite:///{tmp_path / 'a.db'}", storage_options={
        "account_name": "devstoreaccount1", "account_key": "a2V5", "endpoint": "http://127.0.0.1:10000/devstoreaccount1"})
    io = az._load_file_io(location="abfs://cont/lake/t")
    assert io.properties["adls.account-name"] == "devstoreaccount1" and io.properties["adls.account-key"] == "a2V5"
    made = io.fs_by_scheme("abfs", "cont").__reduce__()[1][0]
    assert (made["account_name"], made["account_key"], made["blob_storage_authority"], made["blob_storage_scheme"]) \
        == ("devstoreaccount1", "a2V5", "127.0.0.1:10000", "http")
