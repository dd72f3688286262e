"""Which library the mirror's store uses (docs/mirror.md, "Where the table lives"): Parquet of ~64 MiB written
and read, and many small objects put (create-if-absent), head'd, read and listed, through each candidate, against
moto's S3 server on loopback and a local directory, in one run; ratios against obstore (the store's choice).

Candidates: obstore (Rust object_store: conditional puts), pyarrow.fs.S3FileSystem (C++, multipart; no
conditional headers), boto3 (conditional puts via IfNoneMatch), and the store itself (obstore behind the
mirror's interface) and the local store. moto is a Python server: its own cost is in every figure, so the
ratios compare clients on one server, not S3's throughput. The bench runs moto's stock (threaded) server, not the
tests' serialised one, so that a client uploading parts in parallel is not held back by the test double.

    python -m bench.bench_store [--mib 64] [--small 300]
"""

from __future__ import annotations

import argparse
import io
import shutil
import tempfile
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from bench._util import best_of, table


def _table(mib: int) -> pa.Table:
    n = mib * 1024 * 1024 // 16
    rng = np.random.default_rng(7)
    return pa.table({"pk": np.arange(n, dtype=np.int64), "v": rng.random(n)})


def _arrow_s3(server):
    """pyarrow's S3 file system on the test server (a candidate measured here; the product has no pyarrow file
    system: everything goes through its Store)."""
    from pyarrow import fs

    opts = server.options()
    scheme, _, host = opts["aws_endpoint"].partition("://")
    return fs.S3FileSystem(access_key=opts["aws_access_key_id"], secret_key=opts["aws_secret_access_key"],
                           region=opts["aws_region"], endpoint_override=host, scheme=scheme)


def _parquet(tbl: pa.Table, store, server, bucket: str, local: Path) -> dict[str, tuple[float, float]]:
    """(write s, read s) per candidate, best of 3."""
    import boto3
    import obstore
    s3fs = _arrow_s3(server)
    ob = store.client()
    b3 = boto3.client("s3", endpoint_url=server.endpoint, aws_access_key_id=server.options()["aws_access_key_id"],
                      aws_secret_access_key=server.options()["aws_secret_access_key"], region_name="us-east-1")
    out: dict[str, tuple[float, float]] = {}
    key = f"{bucket}/p/{uuid.uuid4().hex}.parquet"

    def w_arrow():
        with s3fs.open_output_stream(key) as f:
            pq.write_table(tbl, f)

    def r_arrow():
        pq.read_table(key, filesystem=s3fs)

    def w_boto():
        buf = io.BytesIO()
        pq.write_table(tbl, buf)
        b3.put_object(Bucket=bucket, Key="p/boto.parquet", Body=buf.getvalue())

    def r_boto():
        data = b3.get_object(Bucket=bucket, Key="p/boto.parquet")["Body"].read()
        pq.read_table(pa.BufferReader(data))

    def w_obstore_put():
        buf = io.BytesIO()
        pq.write_table(tbl, buf)
        obstore.put(ob, "p/obput.parquet", buf.getvalue())

    def r_obstore_get():
        pq.read_table(pa.BufferReader(obstore.get(ob, "p/obput.parquet").bytes()))

    target = store.join("p/store.parquet")

    def w_store():
        with store.open_output(target) as f:
            pq.write_table(tbl, f)

    def r_store():
        with store.open_input(target) as f:
            pq.read_table(f)

    lpath = local / "l.parquet"
    from msgstream_spark.mirror.store import open_store

    lstore = open_store(str(local))

    def w_local():
        with lstore.open_output(str(lpath)) as f:
            pq.write_table(tbl, f)

    def r_local():
        with lstore.open_input(str(lpath)) as f:
            pq.read_table(f)

    for name, w, r in (("store (obstore multipart writer, ranged reader)", w_store, r_store),
                       ("obstore put/get of whole bytes", w_obstore_put, r_obstore_get),
                       ("pyarrow S3FileSystem", w_arrow, r_arrow),
                       ("boto3 put_object/get_object", w_boto, r_boto),
                       ("local store (no S3)", w_local, r_local)):
        out[name] = (best_of(w, 3), best_of(r, 3))
    return out


def _small(n: int, store, server, bucket: str, local: Path) -> dict[str, tuple[float, float]]:
    """(create-if-absent of n 1-KiB objects s, head + read + one listing s) per candidate."""
    import boto3
    from pyarrow.fs import FileSelector

    from msgstream_spark.mirror.store import open_store

    data = bytes(1024)
    b3 = boto3.client("s3", endpoint_url=server.endpoint, aws_access_key_id=server.options()["aws_access_key_id"],
                      aws_secret_access_key=server.options()["aws_secret_access_key"], region_name="us-east-1")
    s3fs = _arrow_s3(server)
    out = {}
    for name, st in (("store (obstore)", store), ("local store (no S3)", open_store(str(local)))):
        pre = st.join(f"small-{uuid.uuid4().hex}")
        keys = [f"{pre}/{i:06d}" for i in range(n)]
        out[name] = (best_of(lambda st=st, keys=keys: [st.put_if_absent(k, data) for k in keys], 1),
                     best_of(lambda st=st, keys=keys, pre=pre: ([st.head(k) for k in keys], [st.read(k) for k in keys],
                                                                list(st.list(pre))), 1))
    pre = f"small-{uuid.uuid4().hex}"
    out["boto3 (IfNoneMatch)"] = (
        best_of(lambda: [b3.put_object(Bucket=bucket, Key=f"{pre}/{i:06d}", Body=data, IfNoneMatch="*")
                         for i in range(n)], 1),
        best_of(lambda: ([b3.head_object(Bucket=bucket, Key=f"{pre}/{i:06d}") for i in range(n)],
                         [b3.get_object(Bucket=bucket, Key=f"{pre}/{i:06d}")["Body"].read() for i in range(n)],
                         b3.get_paginator("list_objects_v2").paginate(Bucket=bucket, Prefix=pre).build_full_result()),
                1))
    pre = f"{bucket}/small-{uuid.uuid4().hex}"

    def put_arrow():
        for i in range(n):
            with s3fs.open_output_stream(f"{pre}/{i:06d}") as f:
                f.write(data)

    def read_arrow():
        s3fs.get_file_info([f"{pre}/{i:06d}" for i in range(n)])
        for i in range(n):
            with s3fs.open_input_stream(f"{pre}/{i:06d}") as f:
                f.read()
        s3fs.get_file_info(FileSelector(pre, recursive=True))

    out["pyarrow S3FileSystem (no conditional put)"] = (best_of(put_arrow, 1), best_of(read_arrow, 1))
    return out


def _print(title: str, res: dict[str, tuple[float, float]], base: str, unit: str, amount: float) -> dict:
    bw, br = res[base]
    print(f"-- {title}", flush=True)
    print(table([(f"{n} write", amount / w, None if n == base else bw / w) for n, (w, _) in res.items()], unit))
    reads = [(f"{n} read", amount / r, None if n == base else br / r) for n, (_, r) in res.items()]
    print(table(reads, unit), flush=True)
    return {n: {"write_s": w, "read_s": r, "write_ratio": bw / w, "read_ratio": br / r} for n, (w, r) in res.items()}


def run(mib: int = 64, small: int = 300) -> dict:
    from msgstream_spark.mirror.store import open_store
    from tests.fixtures.s3_server import S3Server

    tmp = Path(tempfile.mkdtemp(prefix="bench-store-"))
    server = S3Server(tmp, serial=False).start()  # moto's stock threaded server: parts upload in parallel
    try:
        bucket = server.new_bucket("bench")
        store = open_store(f"s3://{bucket}/t", server.options(), env={})
        tbl = _table(mib)
        local = tmp / "local"
        local.mkdir()
        res = {"parquet": _print(f"Parquet, {mib} MiB of int64+float64 (MiB/s; ratio vs the store)",
                                 _parquet(tbl, store, server, bucket, local), "store (obstore multipart writer, "
                                 "ranged reader)", "MiB/s", tbl.nbytes / 2**20),
               "small": _print(f"{small} objects of 1 KiB: create-if-absent, then head + read each + one listing "
                               "(objects/s; ratio vs the store)", _small(small, store, server, bucket, local),
                               "store (obstore)", "objs/s", small)}
        return res
    finally:
        server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=int, default=64)
    ap.add_argument("--small", type=int, default=300)
    a = ap.parse_args()
    run(a.mib, a.small)
