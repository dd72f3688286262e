"""A table's listing names each file as before, with its root parsed once (issue #44: a database job's expiry
listed 20 tables, and each listed path parsed the root again: ``uri.relative`` per file was a quarter of a
vacuum's CPU; a Delta table's live files, read at each batch's plan and maintenance check, resolved each path the same
way). ``uri.relative_to(root)`` answers what ``uri.relative(root, path)`` answers and ``uri.resolver(root)`` what
``uri.resolve(root, path)`` does, for the paths a listing or a log gives and for any other; the local store's
listing names the same files in the same style as ``uri.join`` does."""

from __future__ import annotations

import os

from msgstream_spark.mirror.store import uri
from msgstream_spark.mirror.store.local import LocalStore


def test_relative_to_answers_as_relative(tmp_path):
    roots = [str(tmp_path / "t"), str(tmp_path / "t") + "/", f"file://{tmp_path}/t", "s3://bucket/lake/t",
             "s3://bucket/lake/t/", "s3://bucket", "gs://b/x"]
    tails = ["data/a.parquet", "_delta_log/00000000000000000001.json", "deletion_vector_x.bin", "data/p=1/b.parquet"]
    for root in roots:
        rel = uri.relative_to(root)
        loc = uri.parse(root)
        base = loc.key if loc.kind == "local" else loc.uri()
        targets = [f"{base.rstrip('/')}/{t}" for t in tails]
        targets += [f"{base.rstrip('/')}/../other/x.parquet", f"{base.rstrip('/')}/data/../a.parquet",
                    f"{base.rstrip('/')}x/a.parquet", base, "s3://other/lake/t/a.parquet", "/elsewhere/a.parquet",
                    f"{base.rstrip('/')}/data/a.parquet?v=1", f"{base.rstrip('/')}//data/a.parquet"]
        for target in targets:
            assert rel(target) == uri.relative(root, target), (root, target)


def test_the_local_listing_names_files_in_the_prefix_style(tmp_path):
    for rel in ("a.json", "data/b.parquet", "data/p=1/c.parquet", "_keys/d.idx"):
        os.makedirs(os.path.dirname(tmp_path / "t" / rel), exist_ok=True)
        (tmp_path / "t" / rel).write_bytes(b"x")
    store = LocalStore(str(tmp_path))
    for prefix in (str(tmp_path / "t"), str(tmp_path / "t") + "/", f"file://{tmp_path}/t"):
        got = sorted(m.uri for m in store.list(prefix))
        want = sorted(uri.join(prefix, os.path.relpath(os.path.join(d, f), tmp_path / "t"))
                      for d, _, fs in os.walk(tmp_path / "t") for f in fs)
        assert got == want and len(got) == 4, prefix


def test_resolver_answers_as_resolve(tmp_path):
    roots = [str(tmp_path / "t"), str(tmp_path / "t") + "/", f"file://{tmp_path}/t", "s3://bucket/lake/t",
             "s3://bucket/lake/t/", "s3://bucket", "gs://b/x"]
    paths = ["data/a.parquet", "/data/a.parquet/", "part=1/b%20c.parquet", "", "/", "s3://other/x.parquet",
             "file:///abs/x.parquet", "/abs/y.parquet", "deletion_vector_x.bin"]
    for root in roots:
        res = uri.resolver(root)
        for path in paths:
            assert res(path) == uri.resolve(root, path), (root, path)


def test_a_parse_is_kept_for_uris_and_absolute_paths_never_for_relative_ones(tmp_path, monkeypatch):
    """``uri.parse`` keeps what a URI or an absolute path parses to (a database job's batch parses ~50 locations a
    table); a relative path follows the working directory at each call; a bad scheme is refused at each call."""
    import pytest

    from msgstream_spark.errors import ConfigError
    from msgstream_spark.mirror.store import uri

    assert uri.parse("s3://bucket/lake/t/") == uri.Location("s3", "s3", "s3://bucket", "lake/t")
    assert uri.parse(f"file://{tmp_path}/t") == uri.parse(str(tmp_path / "t")) == uri.Location(
        "local", "", "", str(tmp_path / "t"))
    hits = uri._parse.cache_info().hits
    uri.parse("s3://bucket/lake/t/")
    assert uri._parse.cache_info().hits == hits + 1
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    monkeypatch.chdir(tmp_path / "a")
    assert uri.parse("t").key == str(tmp_path / "a" / "t")
    monkeypatch.chdir(tmp_path / "b")
    assert uri.parse("t").key == str(tmp_path / "b" / "t")
    for _ in range(2):
        with pytest.raises(ConfigError, match="unknown scheme 'ftp'"):
            uri.parse("ftp://host/t")
