"""A REST catalog someone else wrote (lakana-server, tests/fixtures/rest_catalog_env.py), configured the way
pyiceberg users configure one (``PYICEBERG_CATALOG__<NAME>__TYPE=rest``, ``URI``, ``TOKEN``, ``PREFIX``): a table
created, appended to and read back by a separately configured plain pyiceberg client, its files in the bucket on
the S3 server; the token never in an error. (A smoke test of the catalog + FileIO wiring; the server assigns
table locations, which phase 2's mirror must accept: docs/mirror.md.)"""

from __future__ import annotations

import uuid

import pyarrow as pa
import pytest

from msgstream_spark.errors import ConfigError
from msgstream_spark.mirror.formats.iceberg.catalog import ensure_namespace, resolve_catalog
from msgstream_spark.mirror.store.settings import for_pyiceberg

ROWS = pa.table({"pk": pa.array([1, 2, 3], pa.int64()), "name": pa.array(["a", "b", "c"])})


def test_rest_catalog_with_its_warehouse_on_s3(rest_catalog, s3, monkeypatch, tmp_path):
    env_name = f"e{uuid.uuid4().hex[:10]}"
    rest_catalog.new_environment(env_name, s3.uri("wh"), for_pyiceberg(s3.options()))
    monkeypatch.setenv("PYICEBERG_HOME", str(tmp_path))
    for key, value in {"TYPE": "rest", "URI": rest_catalog.uri, "TOKEN": rest_catalog.token,
                       "PREFIX": env_name}.items():
        monkeypatch.setenv(f"PYICEBERG_CATALOG__REST__{key}", value)
    cat = resolve_catalog(s3.uri("wh"), name="rest", storage_options=s3.options())
    ident = ("bronze", "books")
    ensure_namespace(cat, ident)
    tbl = cat.create_table(ident, schema=ROWS.schema)
    tbl.append(ROWS)
    assert tbl.location().startswith(f"s3://{s3.bucket}/wh/managed/bronze/books-")

    from pyiceberg.catalog.rest import RestCatalog

    plain = RestCatalog("other", uri=rest_catalog.uri, token=rest_catalog.token, prefix=env_name,
                        **for_pyiceberg(s3.options()))
    back = plain.load_table(ident).scan().to_arrow().sort_by("pk")
    assert back.column("name").to_pylist() == ["a", "b", "c"]
    keys = [o["Key"] for o in s3.server.boto3().list_objects_v2(Bucket=s3.bucket)["Contents"]]
    assert any(k.endswith(".metadata.json") for k in keys) and any(k.endswith(".parquet") for k in keys)

    with pytest.raises(ConfigError) as e:  # a wrong prefix: the server's error, no token in it
        resolve_catalog(s3.uri("wh"), name="rest", options={"prefix": "no-such-env", "uri": "http://127.0.0.1:1"},
                        storage_options=s3.options())
    assert rest_catalog.token not in str(e.value)
