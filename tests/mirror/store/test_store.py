"""The store's contract, the same on a local directory, on the S3 server and on Azurite (Azure Blob): whole and
ranged reads, metadata, listing, deletes, Parquet streamed in and out, and the two conditional puts the commit and
the lease stand on (a racing create has exactly one winner; a compare-and-swap on a stale etag is refused). The
store pickles into another process (a Spark task) and works there."""

from __future__ import annotations

import pickle
import subprocess
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from msgstream_spark.mirror.store import AlreadyExists, Conflict, NotFound, open_store
from tests.mirror.store.racing import race


def test_put_read_range_head_list_delete(store):
    a, b = store.join("data", "part-0.parquet"), store.join("_delta_log", "00000000000000000000.json")
    m = store.put(a, b"0123456789")
    store.put(b, b"{}")
    assert m.size == 10 and m.etag
    assert store.read(a) == b"0123456789"
    assert store.read_range(a, 3, 4) == b"3456"
    assert store.read_range(a, 8, 10) == b"89"
    head = store.head(a)
    assert head.size == 10 and head.uri == a and head.mtime > 0
    assert store.head(store.join("nope")) is None
    assert sorted(x.uri for x in store.list(store.root)) == sorted([a, b])
    assert [x.uri for x in store.list(store.join("data"))] == [a]
    assert list(store.list(store.join("dat"))) == []  # a prefix is a directory, not a string prefix
    store.delete(a)
    store.delete(a)  # gone already: no error
    with pytest.raises(NotFound):
        store.read(a)
    with pytest.raises(FileNotFoundError):  # NotFound is also what a local open() raises
        store.read(a)
    assert [x.uri for x in store.list(store.root)] == [b]


def test_put_replaces_whole_and_changes_the_etag(store):
    u = store.join("x")
    first = store.put(u, b"one")
    second = store.put(u, b"two, longer")
    assert store.read(u) == b"two, longer"
    assert first.etag != second.etag == store.head(u).etag


def test_create_if_absent_has_one_winner(store):
    u = store.join("_delta_log", "00000000000000000001.json")
    won, lost = race([lambda i=i: (store.put_if_absent(u, f"writer {i}".encode()), i)[1] for i in range(8)],
                     AlreadyExists)
    assert len(won) == 1 and len(lost) == 7
    assert store.read(u) == f"writer {won[0]}".encode()
    with pytest.raises(AlreadyExists, match="already exists"):
        store.put_if_absent(u, b"late")
    assert store.read(u) == f"writer {won[0]}".encode()


def test_compare_and_swap_refuses_a_stale_etag(store):
    u = store.join("_msgstream_lease.json")
    m = store.put_if_absent(u, b"holder a")
    m2 = store.put_if_match(u, b"holder a, renewed", m.etag)
    with pytest.raises(Conflict):
        store.put_if_match(u, b"holder b", m.etag)
    assert store.read(u) == b"holder a, renewed"
    store.delete(u)
    with pytest.raises(Conflict):
        store.put_if_match(u, b"holder c", m2.etag)
    assert store.head(u) is None


def test_compare_and_swap_race_has_one_winner(store):
    u = store.join("lease")
    m = store.put(u, b"initial")  # no racer writes these bytes (an S3 etag is the content's MD5)
    wins, _ = race([lambda i=i: (store.put_if_match(u, str(i).encode(), m.etag), i)[1] for i in range(6)], Conflict)
    assert len(wins) == 1 and store.read(u) == str(wins[0]).encode()


def test_parquet_streams_out_and_in(store):
    t = pa.table({"pk": pa.array(range(200_000), pa.int64()), "v": pa.array([float(i) for i in range(200_000)])})
    u = store.join("data", "part-1.parquet")
    with store.open_output(u) as f:
        with pq.ParquetWriter(f, t.schema) as w:
            for batch in t.to_batches(max_chunksize=50_000):
                w.write_batch(batch)
    assert store.head(u).size > 0
    with store.open_input(u) as f:
        pf = pq.ParquetFile(f)
        assert pf.metadata.num_rows == 200_000
        assert pf.read(columns=["pk"]).column(0).to_pylist()[-3:] == [199_997, 199_998, 199_999]
    assert pq.read_table(pa.BufferReader(store.read(u))).equals(t)


def test_a_failed_write_publishes_nothing(store):
    u = store.join("data", "part-2.parquet")
    with pytest.raises(RuntimeError, match="task died"):
        with store.open_output(u) as f:
            f.write(b"PAR1" + bytes(1000))
            raise RuntimeError("task died")
    assert store.head(u) is None
    assert list(store.list(store.root)) == []


def test_the_store_pickles_into_another_process(store):
    u = store.join("from-driver")
    store.put(u, b"hello")
    clone = pickle.loads(pickle.dumps(store))
    assert clone.read(u) == b"hello" and repr(clone) == repr(store)
    code = ("import pickle, sys; s = pickle.loads(sys.stdin.buffer.read()); "
            "s.put(s.join('from-task'), s.read(s.join('from-driver')) + b' back')")
    subprocess.run([sys.executable, "-c", code], input=pickle.dumps(store), check=True, timeout=120)
    assert store.read(store.join("from-task")) == b"hello back"


def test_local_locations_as_paths_and_file_uris(tmp_path):
    plain = open_store(str(tmp_path / "t"))
    as_uri = open_store(f"file://{tmp_path}/t")
    plain.put(plain.join("a", "b"), b"1")
    assert plain.join("a", "b") == str(tmp_path / "t" / "a" / "b")
    assert as_uri.join("a", "b") == f"file://{tmp_path}/t/a/b"
    assert as_uri.read(as_uri.join("a", "b")) == b"1"
    assert [m.uri for m in as_uri.list(as_uri.root)] == [f"file://{tmp_path}/t/a/b"]


def test_a_uri_outside_the_store_is_refused(s3):
    from msgstream_spark.mirror.store import StoreError

    st = open_store(s3.uri("t"), s3.options(), env={})
    with pytest.raises(StoreError, match="not in the store"):
        st.read("s3://another-bucket/t/x")


def test_without_obstore_the_error_names_the_extra(monkeypatch):
    from msgstream_spark.errors import MirrorError

    monkeypatch.setitem(sys.modules, "obstore", None)  # as if not installed
    st = open_store("s3://bucket/t", {"aws_region": "us-east-1"}, env={})
    with pytest.raises(MirrorError, match=r"msgstream-spark\[mirror\]"):
        st.read(st.join("x"))
