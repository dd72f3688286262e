"""A Spark task builds a store per table it writes or plans (``store_for``, an unpickled ``PlanTarget``); each made
its own obstore client and connections (a database job's task: one per table). Shipped stores of one bucket and
settings now share one client per process; other settings, another process (a forked child), or a store whose
settings this process resolved itself (the driver's) get their own."""

from __future__ import annotations

import os
import pickle

from msgstream_spark.mirror.store import objstore, open_store, store_for


def test_shipped_stores_of_one_bucket_and_settings_share_a_client(s3, monkeypatch):
    driver = open_store(s3.uri("lake"), s3.options(), env={})
    a = store_for(s3.uri("lake", "t1"), driver.options)
    b = store_for(s3.uri("lake", "t2"), driver.options)
    c = pickle.loads(pickle.dumps(open_store(s3.uri("lake", "t3"), s3.options(), env={})))  # a PlanTarget's
    assert a.client() is b.client() is c.client()
    for i, st in enumerate((a, b, c)):  # each still writes and reads under its own root
        st.put(st.join("claims", "x"), f"{i}".encode())
        assert st.read(st.join("claims", "x")) == f"{i}".encode()
    assert [m.uri for m in a.list(a.root)] == [a.join("claims", "x")]
    assert driver.client() is not a.client()  # resolved here (its environment read): its own, as before

    other = store_for(s3.uri("lake", "t4"), {**driver.options, "aws_secret_access_key": "another"})
    assert other.client() is not a.client()  # other settings (credentials): another client

    pid = os.getpid()
    monkeypatch.setattr(objstore.os, "getpid", lambda: pid + 1)  # as a forked child sees itself
    child = store_for(s3.uri("lake", "t1"), driver.options)
    assert child.client() is not a.client()
    child.put(child.join("y"), b"child")
    assert child.read(child.join("y")) == b"child"
