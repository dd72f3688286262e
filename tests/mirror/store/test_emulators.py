"""What the two emulators the suite runs enforce of the conditional puts the commit and the lease stand on, proved
through obstore (what the store uses) and the emulators' own HTTP APIs, before anything is built on them.

- Azurite (Azure Blob) refuses a second create of a name (409) and a replace on a stale etag (412): the store, the
  lease and a Delta mirror run on it (tests/mirror/store/test_store.py, test_lease.py,
  tests/mirror/test_on_emulators.py).
- gcp-storage-emulator (GCS) refuses neither: it ignores ``x-goog-if-generation-match`` (what object_store sends
  for a create) and ``ifGenerationMatch`` (the JSON API's), and answers an XML API upload without the ``ETag``
  header object_store needs, and does not implement the XML API's listing, so obstore can neither write to it
  nor list it. A mirror on it could not prove single-writer
  safety even if it could write: docs/mirror.md, "Where the table lives", names the gap.
"""

from __future__ import annotations

import urllib.request

import pytest

from msgstream_spark.mirror.store import AlreadyExists, Conflict, StoreError, open_store


def _xml_put(endpoint: str, bucket: str, key: str, data: bytes, headers: dict[str, str]) -> int:
    req = urllib.request.Request(f"{endpoint}/{bucket}/{key}", data=data, method="PUT",
                                 headers={"Content-Type": "application/octet-stream", **headers})
    with urllib.request.urlopen(req, timeout=10) as r:
        return r.status


def _read(endpoint: str, bucket: str, key: str) -> bytes:
    with urllib.request.urlopen(f"{endpoint}/{bucket}/{key}", timeout=10) as r:
        return r.read()


def test_gcs_emulator_accepts_a_second_conditional_create(gcs):
    """NOT refused: a second create of the same name (``x-goog-if-generation-match: 0``, as object_store sends it
    on the XML API; ``ifGenerationMatch=0`` on the JSON API) is accepted and replaces the first object, where GCS
    answers 412. A writer lease or a Delta commit by put-if-absent is no mutual exclusion on this emulator."""
    end, b = gcs.server.endpoint, gcs.name
    create = {"x-goog-if-generation-match": "0"}
    assert _xml_put(end, b, "_delta_log/1.json", b"writer a", create) == 200
    assert _xml_put(end, b, "_delta_log/1.json", b"writer b", create) == 200  # GCS: 412 Precondition Failed
    assert _read(end, b, "_delta_log/1.json") == b"writer b"
    url = f"{end}/upload/storage/v1/b/{b}/o?uploadType=media&name=lease&ifGenerationMatch=0"
    for data in (b"holder a", b"holder b"):
        req = urllib.request.Request(url, data=data, method="POST", headers={"Content-Type": "text/plain"})
        with urllib.request.urlopen(req, timeout=10) as r:
            assert r.status == 200  # the second one too: GCS refuses it with 412
    assert _read(end, b, "lease") == b"holder b"


def test_gcs_emulator_answers_obstore_neither_an_upload_nor_a_listing(gcs):
    """obstore's put (the store's every write) fails on this emulator: its XML API answers an upload without an
    ``ETag`` header; and a listing (the XML API's ``list-type=2``, also what delta-rs asks to find a table) with
    501 Not Implemented. The errors name the object and the prefix. The store, the lease and the mirror cannot
    run on it."""
    store = open_store(gcs.uri("lake", "t"), gcs.options(), env={})
    target = store.join("_delta_log", "00000000000000000000.json")
    with pytest.raises(StoreError, match=r"(?s)_delta_log/00000000000000000000\.json.*ETag Header missing"):
        store.put_if_absent(target, b"{}")
    with pytest.raises(StoreError, match="ETag Header missing"):
        store.put(store.join("data"), b"x")
    with pytest.raises(StoreError, match=rf"(?s)listing {store.root}.*501 Not Implemented"):
        list(store.list(store.root))


def test_azurite_refuses_a_second_create_and_a_stale_etag(azure):
    """Refused: a second put-if-absent of a name (409, obstore's AlreadyExistsError) and a put-if-match on an etag
    the object no longer has (412, obstore's PreconditionError); the object keeps what the winner wrote."""
    import obstore
    from obstore.exceptions import AlreadyExistsError, PreconditionError
    from obstore.store import from_url

    from msgstream_spark.mirror.store import settings

    config, client = settings.for_obstore(azure.options())
    st = from_url(f"az://{azure.name}", config=config, client_options=client)
    first = obstore.put(st, "lease", b"holder a", mode="create")
    with pytest.raises(AlreadyExistsError):
        obstore.put(st, "lease", b"holder b", mode="create")
    renewed = obstore.put(st, "lease", b"holder a, renewed", mode={"e_tag": first["e_tag"]})
    assert renewed["e_tag"] != first["e_tag"]
    with pytest.raises(PreconditionError):
        obstore.put(st, "lease", b"holder c", mode={"e_tag": first["e_tag"]})
    assert obstore.get(st, "lease").bytes().to_bytes() == b"holder a, renewed"
    # and through the store: the errors the commit and the lease act on
    store = open_store(azure.uri("t"), azure.options(), env={})
    m = store.put_if_absent(store.join("x"), b"1")
    with pytest.raises(AlreadyExists, match="already exists"):
        store.put_if_absent(store.join("x"), b"2")
    store.put_if_match(store.join("x"), b"3", m.etag)
    with pytest.raises(Conflict):
        store.put_if_match(store.join("x"), b"4", m.etag)
    assert store.read(store.join("x")) == b"3"
