"""Conditional puts whose answer was lost, through a fault front before the S3 server (tests/fixtures/s3_front.py):
the server applies the put and the client is answered 500, so obstore retries it and the retry is refused
(412: the object is there, or its etag moved) because of the first attempt. The store reads the object back and
takes identical bytes for its own write: a Delta commit lands once and reports success, the writer lease is
acquired and renewed (no refusal naming its own holder, no lost lease). S3's 409 ``ConditionalRequestConflict``
to a create is retried. (The local store has no retry path: a hard link or a flock'd replace either happens or
raises in this process.)"""

from __future__ import annotations

import json

import pytest

from msgstream_spark.mirror import apply_batch, open_table
from msgstream_spark.mirror.store import AlreadyExists, Conflict, Lease, StoreError, open_store
from msgstream_spark.mirror.store import objstore as objstore_mod
from tests.fixtures.s3_front import S3Front
from tests.mirror.changes import FIELDS, fill, mixed_batches, model, table_state, to_arrow, upsert


@pytest.fixture
def front(s3, tmp_path):
    f = S3Front(s3.endpoint, tmp_path).start()
    try:
        yield f
    finally:
        f.stop()


def test_a_create_whose_answer_was_lost_is_taken_as_written(s3, front):
    store = open_store(s3.uri("t"), front.options(s3.options()), env={})
    front.lose_answer("/x", "if-none-match")
    meta = store.put_if_absent(store.join("x"), b"one writer's bytes")
    assert [(m, p.rsplit("/", 1)[1], status) for m, p, status in front.lost()] == [("PUT", "x", 200)]
    assert store.read(store.join("x")) == b"one writer's bytes"
    assert meta.etag == store.head(store.join("x")).etag
    with pytest.raises(AlreadyExists, match="another writer created it first"):  # other bytes: another writer
        store.put_if_absent(store.join("x"), b"another writer's bytes")
    assert store.read(store.join("x")) == b"one writer's bytes"


def test_a_replace_whose_answer_was_lost_is_taken_as_written(s3, front):
    store = open_store(s3.uri("t"), front.options(s3.options()), env={})
    first = store.put_if_absent(store.join("x"), b"v1")
    front.lose_answer("/x", "if-match")
    second = store.put_if_match(store.join("x"), b"v2", first.etag)
    assert len(front.lost()) == 1 and store.read(store.join("x")) == b"v2"
    assert second.etag == store.head(store.join("x")).etag != first.etag
    with pytest.raises(Conflict, match="changed or is gone since etag"):  # a stale etag with other bytes
        store.put_if_match(store.join("x"), b"v3", first.etag)
    assert store.read(store.join("x")) == b"v2"


def test_a_create_racing_another_conditional_write_is_retried(s3, front, monkeypatch):
    """S3 answers 409 ConditionalRequestConflict while another conditional write of the key is in flight:
    retried (object_store reports it as already-exists, which was taken for a refusal), up to CONFLICT_RETRIES
    times, then a StoreError naming the conflicts (not an AlreadyExists: nobody created the object)."""
    store = open_store(s3.uri("t"), front.options(s3.options()), env={})
    front.conflict("/x", "if-none-match", times=2)
    store.put_if_absent(store.join("x"), b"created after two conflicts")
    assert len(front.conflicts()) == 2 and store.read(store.join("x")) == b"created after two conflicts"
    monkeypatch.setattr(objstore_mod, "CONFLICT_RETRIES", 3)
    front.conflict("/y", "if-none-match", times=3)
    with pytest.raises(StoreError, match=r"3 conditional-put conflicts \(409\) in a row") as e:
        store.put_if_absent(store.join("y"), b"never")
    assert not isinstance(e.value, AlreadyExists) and store.head(store.join("y")) is None


def test_the_lease_is_acquired_when_the_answer_is_lost(s3, front):
    store = open_store(s3.uri("t"), front.options(s3.options()), env={})
    lease = Lease(store, store.root, "mirror run", auto_renew=False)
    front.lose_answer("_msgstream_writer.lease", "if-none-match")
    lease.acquire()  # not refused naming itself
    lease.check()
    assert len(front.lost()) == 1 and json.loads(store.read(lease.uri))["holder"] == lease.token
    lease.release()
    assert json.loads(store.read(lease.uri))["expires"] == 0.0


def test_the_lease_is_renewed_when_the_answer_is_lost(s3, front):
    store = open_store(s3.uri("t"), front.options(s3.options()), env={})
    lease = Lease(store, store.root, "mirror run", auto_renew=False).acquire()
    before = json.loads(store.read(lease.uri))["expires"]
    front.lose_answer("_msgstream_writer.lease", "if-match")
    lease.renew()  # not lost to itself
    lease.check()
    assert len(front.lost()) == 1
    assert json.loads(store.read(lease.uri))["expires"] == lease.expires >= before
    lease.release()


def test_a_delta_commit_whose_answer_was_lost_lands_once_and_succeeds(s3, front):
    opts = front.options(s3.options())
    loc = s3.uri("lake", "t")
    t = open_table("delta", loc, collection="coll", pk="pk", arrow_schema=FIELDS, create=True, storage_options=opts)
    seen = fill(t, mixed_batches(1))
    front.lose_answer("_delta_log/00000000000000000002.json", "if-none-match")
    more = upsert(500, (3, "after a lost answer"))
    assert apply_batch(t, to_arrow(more), "pk", "q", 1)  # not "written by another writer"
    assert len(front.lost()) == 1
    again = open_table("delta", loc, collection="coll", pk="pk", create=False, storage_options=s3.options())
    assert again.live_files().version == 2
    assert table_state(again.to_arrow()) == model(seen + more)
    assert again.last_batch("q") == 1
    names = {m.uri.rsplit("/", 1)[1] for m in open_store(loc, s3.options(), env={}).list(loc + "/_delta_log")}
    assert {n for n in names if n.endswith(".json")} == {f"{v:020d}.json" for v in range(3)}
