"""#45 item 5: one table per location. Creating a table where a table already is (another catalog's Iceberg
metadata, a Delta log) is refused naming the location, what is there and what to give, and leaves the first
table's files as they were (its vacuum deleted the other's files and current metadata before); re-opening a table
through its own catalog (the default SQLite catalog by location, a SQL catalog by URI, a named catalog by
identifier) still opens it. On a local directory and on moto's S3 server."""

from __future__ import annotations

import pytest

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror import open_table
from msgstream_spark.mirror.maintenance import vacuum
from msgstream_spark.mirror.store import open_store
from tests.mirror.changes import FIELDS, fill, mixed_batches, model, table_state


class Where:
    """A table location (``loc``) on one store, its storage options, SQLite catalog URIs on the local disk."""

    def __init__(self, kind: str, tmp_path, s3=None) -> None:
        self.tmp, self.opts = tmp_path, s3.options() if s3 is not None else None
        self.loc = s3.uri("lake", "t") if s3 is not None else str(tmp_path / "t")

    def catalog(self, name: str) -> str:
        return f"sqlite:///{self.tmp / name}.db"

    def files(self) -> dict[str, str | None]:
        """Every object under the location, with its etag (a rewrite changes it)."""
        return {m.uri: m.etag for m in open_store(self.loc, self.opts, env={}).list(self.loc)}


@pytest.fixture(params=["local", "s3"])
def where(request, tmp_path) -> Where:
    return Where(request.param, tmp_path, request.getfixturevalue("s3") if request.param == "s3" else None)


def _open(fmt: str, where: Where, **kw):
    return open_table(fmt, where.loc, collection="coll", pk="pk", arrow_schema=FIELDS, storage_options=where.opts,
                      **kw)


def test_a_second_sql_catalog_cannot_create_a_table_where_one_is(where):
    first = _open("iceberg", where, catalog_uri=where.catalog("a"))
    want = model(fill(first, mixed_batches(3)))
    before = where.files()
    with pytest.raises(MirrorError, match="already holds an Iceberg table"):  # opened for a snapshot's add_files
        _open("iceberg", where, catalog_uri=where.catalog("b"), create=False)
    with pytest.raises(MirrorError) as err:
        _open("iceberg", where, catalog_uri=where.catalog("b"))
    text = str(err.value)
    assert where.loc in text and "already holds an Iceberg table" in text and "metadata/*.metadata.json" in text
    assert "Nothing was written" in text and "--catalog" in text
    assert where.files() == before  # nothing written at the location
    again = _open("iceberg", where, catalog_uri=where.catalog("a"))  # its own catalog still opens it
    assert table_state(again.to_arrow()) == want
    vacuum(again, retain_s=0)  # the only table there: its vacuum keeps its current files
    assert table_state(_open("iceberg", where, catalog_uri=where.catalog("a")).to_arrow()) == want


def test_a_second_host_default_catalog_cannot_create_a_table_where_one_is(tmp_path):
    """The default SQLite catalog beside the table: re-opened by location it is the same table; a host without
    that file (a second host, or the file lost) is refused instead of registering a second table there."""
    loc = str(tmp_path / "t")
    first = open_table("iceberg", loc, collection="coll", pk="pk", arrow_schema=FIELDS)
    want = model(fill(first, mixed_batches(2)))
    again = open_table("iceberg", loc, collection="coll", pk="pk", arrow_schema=FIELDS)  # create=True: opens it
    assert table_state(again.to_arrow()) == want
    cat = tmp_path / "t_catalog.sqlite"
    cat.rename(tmp_path / "elsewhere.sqlite")  # the second host has no catalog file beside the table
    before = sorted(p for p in (tmp_path / "t").rglob("*"))
    for create in (True, False):  # the job opens it with create=False, then its snapshot's add_files makes it
        with pytest.raises(MirrorError, match=f"{loc} already holds an Iceberg table .* the default catalog "):
            open_table("iceberg", loc, collection="coll", pk="pk", arrow_schema=FIELDS, create=create)
    assert sorted(p for p in (tmp_path / "t").rglob("*")) == before
    (tmp_path / "elsewhere.sqlite").rename(cat)
    assert table_state(open_table("iceberg", loc, collection="coll", pk="pk").to_arrow()) == want


def test_a_named_catalog_reopens_its_table_and_refuses_another_catalogs(where, monkeypatch, tmp_path):
    monkeypatch.setenv("PYICEBERG_HOME", str(tmp_path))  # no .pyiceberg.yaml of the machine's user
    for name in ("lake", "other"):
        monkeypatch.setenv(f"PYICEBERG_CATALOG__{name.upper()}__TYPE", "sql")
        monkeypatch.setenv(f"PYICEBERG_CATALOG__{name.upper()}__URI", where.catalog(name))
    first = _open("iceberg", where, catalog="lake")
    want = model(fill(first, mixed_batches(2)))
    assert table_state(_open("iceberg", where, catalog="lake").to_arrow()) == want  # by its identifier
    before = where.files()
    with pytest.raises(MirrorError, match="which catalog 'other' does not have"):
        _open("iceberg", where, catalog="other")
    assert where.files() == before


@pytest.mark.parametrize(("there", "new"), [("iceberg", "delta"), ("delta", "iceberg")])
def test_a_table_of_the_other_format_is_not_created_where_one_is(where, there, new):
    kw = {"catalog_uri": where.catalog("a")} if there == "iceberg" else {}
    first = _open(there, where, **kw)
    want = model(fill(first, mixed_batches(2)))
    before = where.files()
    other = {"catalog_uri": where.catalog("b")} if new == "iceberg" else {}
    holds = {"iceberg": "an Iceberg table (Iceberg metadata/*.metadata.json", "delta": "a Delta table (a _delta_log/"}
    for create in (True, False):  # created now, or opened for a snapshot's add_files to make (the job's way)
        with pytest.raises(MirrorError) as err:
            _open(new, where, create=create, **other)
        text = str(err.value)
        assert f"{where.loc} already holds {holds[there]}" in text and f"--table-format {there}" in text
        assert where.files() == before
    assert table_state(_open(there, where, **kw).to_arrow()) == want
