"""The storage snapshot reads Milvus's files through the mirror's ``Store`` (#46 part 2: one storage client).

Milvus's storage v1 files are written here by a small encoder of the layout ``binlog.py`` documents (a magic, a
descriptor event, insert or delete events each holding a Parquet payload; ``internal/storage`` of
milvus-io/milvus), into a bucket of the S3 test server (moto) under a root path, as a MinIO-backed Milvus keeps
them; the reader is configured from the ``minio.*`` keys of milvus.yaml. The same reader on the real Milvus 2.3.5's
own files: tests/milvus_real/test_mirror_storage.py.
"""

from __future__ import annotations

import io
import json
import struct

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from msgstream_spark.config.loader import Config
from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.common import table_schema
from msgstream_spark.mirror.snapshot.storage.access import SegmentGoneError, StorageSettings, storage_settings
from msgstream_spark.mirror.snapshot.storage.binlog import (
    DELETE_EVENT,
    DESCRIPTOR_EVENT,
    DESCRIPTOR_FIX,
    EVENT_TS,
    HEADER,
    INSERT_EVENT,
    MAGIC,
)
from msgstream_spark.mirror.snapshot.storage.plan import TIMESTAMP, ReadTask, StoragePlan
from msgstream_spark.mirror.snapshot.storage.reader import FieldSpec, StorageReader
from msgstream_spark.mirror.snapshot.storage.units import pack, read_bounds
from msgstream_spark.mirror.store import open_store
from msgstream_spark.msg.dtypes import FLOAT_VECTOR, INT64, VARCHAR
from tests.fixtures.s3_server import ACCESS_KEY, SECRET_KEY

COLL, PART, SEG, DIM = 7, 8, 9, 4
PK, TITLE, VEC = 100, 101, 102


def binlog(field_id: int, data_type: int, column: pa.Array, event: int = INSERT_EVENT) -> bytes:
    """A storage v1 binlog of one field holding ``column`` as one event's Parquet payload."""
    extra = json.dumps({"original_size": "0"}).encode()
    desc = DESCRIPTOR_FIX.pack(COLL, PART, SEG, field_id, 1, 2, data_type) + struct.pack("<i", len(extra)) + extra
    payload = io.BytesIO()
    pq.write_table(pa.table({"v": column}), payload)
    body = EVENT_TS.pack(1, 2) + payload.getvalue()
    first = HEADER.size + len(desc)
    out = struct.pack("<I", MAGIC) + HEADER.pack(1, DESCRIPTOR_EVENT, first, 4 + first) + desc
    second = HEADER.size + len(body)
    return out + HEADER.pack(2, event, second, len(out) + second) + body


def _rel(field_id: int) -> str:
    return f"insert_log/{COLL}/{PART}/{SEG}/{field_id}/{1000 + field_id}"


DELTA = f"delta_log/{COLL}/{PART}/{SEG}/77"
STATS = f"stats_log/{COLL}/{PART}/{SEG}/{PK}/1"
N = 6


def milvus_files() -> dict[str, bytes]:
    """One segment of six rows (keys 0..5 at times 10..15), a delete of key 3 at 20 and one of key 4 at 12 (older
    than its row: kept), the key's stats log."""
    vecs = np.arange(N * DIM, dtype="<f4").reshape(N, DIM)
    return {
        _rel(TIMESTAMP): binlog(TIMESTAMP, INT64, pa.array(range(10, 10 + N), pa.int64())),
        _rel(PK): binlog(PK, INT64, pa.array(range(N), pa.int64())),
        _rel(TITLE): binlog(TITLE, VARCHAR, pa.array([f"t{i}" for i in range(N)])),
        _rel(VEC): binlog(VEC, FLOAT_VECTOR, pa.array([r.tobytes() for r in vecs], pa.binary(DIM * 4))),
        DELTA: binlog(0, VARCHAR, pa.array([json.dumps({"pk": 3, "ts": 20, "pkType": 5}),
                                            json.dumps({"pk": 4, "ts": 12, "pkType": 5})]), DELETE_EVENT),
        STATS: json.dumps({"fieldID": PK, "pkType": 5, "minPk": 0, "maxPk": N - 1}).encode(),
    }


def _plan() -> StoragePlan:
    files = tuple((f, _rel(f)) for f in (TIMESTAMP, PK, TITLE, VEC))
    task = ReadTask(SEG, PART, "dml_0_7v0", 99, 0, 0, N, files)
    return StoragePlan(COLL, 1, {}, [task], deltas=[(SEG, 99, DELTA)], segments=[SEG], stats={SEG: [STATS]})


def _reader(settings: StorageSettings) -> StorageReader:
    fields = pa.schema([pa.field("pk", pa.int64()), pa.field("title", pa.string()),
                        pa.field("vec", pa.list_(pa.float32()))])
    specs = [FieldSpec(PK, "pk", INT64), FieldSpec(TITLE, "title", VARCHAR), FieldSpec(VEC, "vec", FLOAT_VECTOR)]
    return StorageReader(settings, specs, table_schema(fields, "pk"), "pk")


def _minio_keys(s3, root: str = "files") -> Config:
    host, _, port = s3.endpoint.removeprefix("http://").partition(":")
    return Config.load(None, overrides={"common.storageType": "minio", "minio.address": host, "minio.port": port,
                                        "minio.bucketName": s3.bucket, "minio.rootPath": root,
                                        "minio.accessKeyID": ACCESS_KEY, "minio.secretAccessKey": SECRET_KEY,
                                        "minio.useSSL": False})


def _read(reader: StorageReader) -> pa.Table:
    plan = _plan()
    milvus = reader.settings.store()
    reader.load_deletes(plan, milvus)
    packing = pack(plan, read_bounds(reader.settings, plan, milvus), 2)
    return pa.Table.from_batches([b for units in packing.tasks for u in units for b in reader.read_unit(u, milvus)],
                                 schema=reader.schema)


def test_a_snapshot_read_from_the_s3_server_through_the_store(s3, monkeypatch):
    """Milvus's files in a bucket under its root path, read with the minio.* keys: the rows Milvus's rules keep
    (key 3 deleted after its row, key 4's delete older than its row); pyarrow's file systems are never called,
    and the machine's own object_store variables (wrong ones here) do not change where the files are read."""
    import pyarrow.fs

    def no_pyarrow_filesystem(*a, **k):
        raise AssertionError("a pyarrow file system was made: the storage snapshot reads through the Store")

    for name in ("S3FileSystem", "LocalFileSystem", "GcsFileSystem", "AzureFileSystem"):
        monkeypatch.setattr(pyarrow.fs, name, no_pyarrow_filesystem, raising=False)
    for k, v in {"AWS_ENDPOINT_URL": "http://127.0.0.1:9", "AWS_ACCESS_KEY_ID": "not-this-one",
                 "AWS_SECRET_ACCESS_KEY": "nor-this"}.items():
        monkeypatch.setenv(k, v)
    store = open_store(s3.uri(), s3.options(), env={})
    for rel, data in milvus_files().items():
        store.put(s3.uri("files", rel), data)
    settings = storage_settings(_minio_keys(s3))
    assert settings.location == s3.uri("files") and settings.kind == "s3"
    got = _read(_reader(settings))
    assert got.column("pk").to_pylist() == [0, 1, 2, 4, 5]
    assert got.column("title").to_pylist() == ["t0", "t1", "t2", "t4", "t5"]
    assert got.column("vec").to_pylist()[1] == [4.0, 5.0, 6.0, 7.0]
    assert got.column("_ts").to_pylist() == [10, 11, 12, 14, 15]
    assert set(got.column("_partition").to_pylist()) == {PART}
    assert SECRET_KEY not in repr(settings)

    store.delete(s3.uri("files", _rel(TITLE)))  # garbage-collected mid-read: the segment and the GC setting named
    with pytest.raises(SegmentGoneError, match=f"segment {SEG}: file .*{_rel(TITLE)}.*dropTolerance") as e:
        _read(_reader(settings))
    assert SECRET_KEY not in str(e.value)


def test_a_local_milvus_s_files_through_the_same_reader(tmp_path):
    for rel, data in milvus_files().items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_bytes(data)
    settings = storage_settings(Config.load(None, overrides={"common.storageType": "local",
                                                             "localStorage.path": str(tmp_path)}))
    assert settings.kind == "local" and settings.store().kind == "local"
    assert _read(_reader(settings)).column("pk").to_pylist() == [0, 1, 2, 4, 5]
    (tmp_path / _rel(TITLE)).unlink()  # a file the OS refuses to read (a directory in its place): named
    (tmp_path / _rel(TITLE)).mkdir()
    with pytest.raises(MirrorError, match=f"cannot read .*{_rel(TITLE)}.* of segment {SEG}"):
        _read(_reader(settings))


def test_milvus_yaml_keys_of_azure_and_gcs_storage():
    """Milvus's own reading of the keys: Azure (the access key id is the account, the secret its key, the address
    the endpoint's suffix) and GCS with the machine's credentials (``useIAM``), as the store's locations."""
    az = storage_settings(Config.load(None, overrides={
        "common.storageType": "remote", "minio.cloudProvider": "azure", "minio.bucketName": "milvus",
        "minio.rootPath": "files", "minio.accessKeyID": "acct", "minio.secretAccessKey": "azkey-secret",
        "minio.address": "core.chinacloudapi.cn"}))
    assert az.location == "az://milvus/files" and az.kind == "azure"
    assert dict(az.options) == {"azure_storage_account_name": "acct", "azure_storage_account_key": "azkey-secret",
                                "azure_storage_endpoint": "https://acct.blob.core.chinacloudapi.cn"}
    assert "azkey-secret" not in repr(az)
    gcs = storage_settings(Config.load(None, overrides={
        "common.storageType": "remote", "minio.cloudProvider": "gcp", "minio.useIAM": True,
        "minio.bucketName": "milvus", "minio.rootPath": "files"}), env={"GOOGLE_SERVICE_ACCOUNT": "/sa.json",
                                                                        "AWS_ACCESS_KEY_ID": "not-read"})
    assert gcs.location == "gs://milvus/files" and dict(gcs.options) == {"google_service_account": "/sa.json"}
    s3 = storage_settings(Config.load(None, overrides={
        "common.storageType": "minio", "minio.address": "h", "minio.port": 9000, "minio.bucketName": "b",
        "minio.accessKeyID": "ak", "minio.secretAccessKey": "sk"}), env={"AWS_SESSION_TOKEN": "not-read"})
    assert s3.location == "s3://b" and "aws_session_token" not in s3.options  # no useIAM: milvus.yaml's keys only


def test_each_attempt_of_a_snapshot_task_writes_a_file_of_its_own(s3):
    """Two attempts of task 0 (a retry, or a speculative copy) into the table's bucket: two files, the first
    attempt's left as it was (it may be the one whose answer the driver takes); each answers its own path."""
    from msgstream_spark.spark.storage_snapshot import _write_fn

    src = open_store(s3.uri(), s3.options(), env={})
    for rel, data in milvus_files().items():
        src.put(s3.uri("milvus", rel), data)
    reader = _reader(storage_settings(_minio_keys(s3, "milvus")))
    plan = _plan()
    reader.load_deletes(plan)
    bins = pack(plan, read_bounds(reader.settings, plan), 1).tasks
    table_store = open_store(s3.uri("table"), s3.options(), env={})
    out_dir = s3.uri("table", "snapshot-1")
    ids = [pa.RecordBatch.from_pydict({"i": [0]})]
    first = list(_write_fn(reader, bins, out_dir, None, table_store)(ids))[0].to_pylist()[0]
    kept = table_store.head(first["path"])
    second = list(_write_fn(reader, bins, out_dir, None, table_store)(ids))[0].to_pylist()[0]
    assert first["path"] != second["path"] and first["rows"] == second["rows"] == 5
    assert table_store.head(first["path"]).etag == kept.etag
    assert sorted(m.uri for m in table_store.list(out_dir)) == sorted([first["path"], second["path"]])


def test_a_snapshot_read_from_azure_blob_through_the_store(azure):
    """The same files in an Azure Blob container (Azurite), read through the same Store: the storage snapshot
    reads wherever the mirror's tables can live (pyarrow's S3 file system read S3 and local disks only)."""
    store = open_store(azure.uri(), azure.options(), env={})
    for rel, data in milvus_files().items():
        store.put(azure.uri("files", rel), data)
    settings = StorageSettings(azure.uri("files"), azure.options())
    assert settings.kind == "azure"
    assert _read(_reader(settings)).column("pk").to_pylist() == [0, 1, 2, 4, 5]


def test_the_spark_route_reads_through_the_store_and_takes_only_what_tasks_returned(spark, s3):
    """``write_storage_snapshot`` in Spark: its tasks read Milvus's files from the S3 server with the settings the
    driver resolved and write into the table's bucket; a file another attempt left in the output directory (a
    speculative copy's, a failed attempt's) is not among the files handed to the table."""
    from msgstream_spark.spark.storage_snapshot import write_storage_snapshot

    src = open_store(s3.uri(), s3.options(), env={})
    for rel, data in milvus_files().items():
        src.put(s3.uri("files", rel), data)
    reader = _reader(storage_settings(_minio_keys(s3)))
    plan = _plan()
    reader.load_deletes(plan)
    packing = pack(plan, read_bounds(reader.settings, plan), 2)
    table_store = open_store(s3.uri("table"), s3.options(), env={})
    out_dir = s3.uri("table", "snapshot-9")
    stray = table_store.join("snapshot-9", "part-00000-0123456789abcdef.parquet")
    table_store.put(stray, b"another attempt's bytes")
    got = write_storage_snapshot(spark, reader, packing, out_dir, plan.rows, store=table_store)
    assert got.rows == 5 and stray not in got.files and len(got.files) == len(packing.tasks)
    rows = pa.concat_tables([pq.read_table(table_store.open_input(f)) for f in got.files])
    assert sorted(rows.column("pk").to_pylist()) == [0, 1, 2, 4, 5]
