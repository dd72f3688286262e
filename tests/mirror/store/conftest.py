"""``store``: a table location on each kind of store in turn (a local directory, a bucket on moto's S3 server, a
container on Azurite's Azure Blob). Not on gcp-storage-emulator: obstore cannot write to it, and it enforces no
conditional put (test_emulators.py)."""

from __future__ import annotations

import pytest

from msgstream_spark.mirror.store import open_store


@pytest.fixture(params=["local", "s3", "azure"])
def store(request, tmp_path):
    if request.param == "local":
        return open_store(str(tmp_path / "books"))
    bucket = request.getfixturevalue(request.param)
    return open_store(bucket.uri("lake", "books"), bucket.options(), env={})
