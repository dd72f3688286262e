"""``store``: a table location on each kind of store in turn (a local directory, a bucket on moto's S3 server)."""

from __future__ import annotations

import pytest

from msgstream_spark.mirror.store import open_store


@pytest.fixture(params=["local", "s3"])
def store(request, tmp_path):
    if request.param == "local":
        return open_store(str(tmp_path / "books"))
    s3 = request.getfixturevalue("s3")
    return open_store(s3.uri("lake", "books"), s3.options(), env={})
