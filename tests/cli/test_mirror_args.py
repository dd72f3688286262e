"""The mirror commands' one table rule (issue #38 item 8): ``--table-format`` defaults to what the location holds
(a ``_delta_log/`` is Delta, Iceberg ``metadata/`` is Iceberg) for ``run``, ``compact``, ``orphans``, ``vacuum``,
``verify`` and ``status`` alike, is needed only to create a table, and a format the location contradicts is refused
naming both. ``verify`` of an Iceberg mirror without the flag once opened it as Delta; ``MSGSTREAM_MILVUS_ADDRESS``
(the documented variable) was refused as "not set" while ``MILVUS_ADDRESS`` passed and then went to localhost.
"""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from msgstream_spark.cli.main import main
from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.table import open_table
from tests.sink.helpers import config_file

SCHEMA = pa.schema([("pk", pa.int64()), ("v", pa.float32())])


def _cli(capsys, *argv: str) -> tuple[int, list, str]:
    """Exit code, JSON documents printed, stderr (a job's usage error exits through its parser)."""
    capsys.readouterr()
    try:
        code = main(list(argv))
    except SystemExit as done:
        code = done.code
    out, err = capsys.readouterr()
    return code, _objects(out), err


def _objects(out: str) -> list:
    """The JSON documents printed (the jobs indent theirs, the Spark-free commands print lines)."""
    dec, docs, i = json.JSONDecoder(), [], 0
    while i < len(out):
        if out[i].isspace():
            i += 1
            continue
        doc, i = dec.raw_decode(out, i)
        docs.append(doc)
    return docs


@pytest.fixture
def tables(tmp_path):
    """A Delta and an Iceberg mirror table of collection ``c`` (no rows), made by the mirror's own tables."""
    d, i = tmp_path / "d", tmp_path / "i"
    open_table("delta", str(d), collection="c", pk="pk", arrow_schema=SCHEMA, create=True)
    open_table("iceberg", str(i), collection="c", pk="pk", arrow_schema=SCHEMA, create=True)
    return str(d), str(i)


def test_every_mirror_command_detects_the_format(tables, local_env, tmp_path, capsys):
    d, i = tables
    for table, fmt in ((d, "delta"), (i, "iceberg")):
        for action in ("orphans", "compact"):
            code, out, err = _cli(capsys, "mirror", action, "--table", table)
            assert code == 0, err
            assert out[-1]["format"] == fmt and out[-1]["job"] == f"mirror {action}"
        code, out, err = _cli(capsys, "mirror", "vacuum", "--table", table, "--dry-run")
        assert code == 0 and out[-1]["format"] == fmt, err
        code, out, err = _cli(capsys, "mirror", "status", "--config", config_file(local_env, tmp_path),
                              "--table", table)
        assert code == 0, err
        assert out[0]["format"] == fmt and out[0]["collection"] == "c"


def _run(argv: list[str], capsys) -> tuple[int, str]:
    """``mirror run``'s parser and run, stopped before Spark: the table arguments are checked first."""
    from msgstream_spark.jobs import mirror
    from msgstream_spark.jobs._common import main_wrapper

    class NoSpark:  # a run that got past its argument checks fails here at once
        def __getattr__(self, name):
            raise AssertionError(f"mirror run reached Spark ({name}) with {argv}")

    with pytest.raises(SystemExit) as done:
        main_wrapper(mirror.build_parser(), lambda a: mirror.run(a, NoSpark()), argv, "msgstream mirror run")
    return done.value.code, capsys.readouterr().err


def test_a_format_the_location_contradicts_is_refused_naming_both(tables, local_env, tmp_path, capsys):
    d, i = tables
    cfg = config_file(local_env, tmp_path)
    code, _, err = _cli(capsys, "mirror", "orphans", "--table", d, "--table-format", "iceberg")
    assert code == 2 and f"--table-format iceberg, but {d} holds a Delta table (a _delta_log/ directory)" in err
    code, _, err = _cli(capsys, "mirror", "status", "--config", cfg, "--table", i, "--table-format", "delta")
    assert code == 2 and f"msgstream mirror status: error: --table-format delta, but {i} holds an Iceberg" in err
    code, err = _run(["--config", cfg, "--collection", "c", "--table", i, "--table-format", "delta"], capsys)
    assert code == 2 and "--table-format delta, but" in err and "pass --table-format iceberg" in err
    code, _, err = _cli(capsys, "mirror", "verify", "--config", cfg, "--collection", "c", "--table", d,
                        "--table-format", "iceberg")
    assert code == 2 and "holds a Delta table" in err  # before Milvus is asked anything


def test_a_format_is_needed_only_to_create_a_table(tables, local_env, tmp_path, capsys):
    d, _ = tables
    cfg = config_file(local_env, tmp_path)
    new = str(tmp_path / "new")
    code, err = _run(["--config", cfg, "--collection", "c", "--table", new], capsys)
    assert code == 2 and f"there is no table at {new} yet: pass --table-format delta or --table-format iceberg" in err
    code, _, err = _cli(capsys, "mirror", "orphans", "--table", new)
    assert code == 1 and f"there is no mirror table at {new}" in err
    code, _, err = _cli(capsys, "mirror", "vacuum", "--table", d, "--catalog-uri", "sqlite:///x.db", "--dry-run")
    assert code == 2 and "--catalog-uri names an Iceberg catalog, but" in err
    both = tmp_path / "both"  # the mirror refuses a second table at a location (#45 item 5): another tool made it
    open_table("iceberg", str(both), collection="c", pk="pk", arrow_schema=SCHEMA, create=True)
    with pytest.raises(MirrorError, match="already holds an Iceberg table"):
        open_table("delta", str(both), collection="c", pk="pk", arrow_schema=SCHEMA, create=True)
    import deltalake

    deltalake.DeltaTable.create(str(both), SCHEMA)
    code, _, err = _cli(capsys, "mirror", "orphans", "--table", str(both))
    assert code == 2 and "holds both a Delta and an Iceberg table" in err
    code, out, err = _cli(capsys, "mirror", "orphans", "--table", str(both), "--table-format", "iceberg")
    assert code == 0 and out[-1]["format"] == "iceberg", err


@pytest.fixture
def collection(milvus_proxy):
    """Collection ``snap`` in the suite's Milvus proxy (DescribeCollection, ShowPartitions, Query), six rows."""
    from tests.mq_milvus.collection_log import CID, NAME, PARTITIONS, collection_schema, row
    from tests.wal26 import producer as P

    model = milvus_proxy.state.add_model("default", NAME, CID, [P.PCHANNEL], [P.VCHANNEL], collection_schema(),
                                         PARTITIONS)
    model.put([row(k) for k in range(6)], "_default")
    return NAME, model


def _iceberg_copy(milvus_proxy, local_env, name: str, location: str) -> None:
    """An Iceberg mirror table holding what the proxy's ``Query`` answers (through verify's own reader)."""
    from msgstream_spark.mirror.apply import apply_batch
    from msgstream_spark.mirror.snapshot.handover import MilvusTarget
    from msgstream_spark.mirror.verify.milvus_side import SdkMilvusSide
    from msgstream_spark.msg.schema import collection_arrow_schema
    from tests.milvus_proxy.wal import tso_now
    from tests.mq_milvus.collection_log import collection_schema

    table = open_table("iceberg", location, collection=name, pk="pk", create=True,
                       arrow_schema=collection_arrow_schema(collection_schema()))
    side = SdkMilvusSide(local_env.config.with_overrides({"milvus.address": milvus_proxy.address}),
                         MilvusTarget(milvus_proxy.address, name))
    rows = pa.Table.from_batches(list(side.scan(table.schema, tso_now())), schema=table.schema)  # at least now
    assert rows.num_rows == 6
    apply_batch(table, rows.append_column("op", pa.array(["insert"] * rows.num_rows)), "pk", "copy", 0)


@pytest.mark.filterwarnings("ignore:.*ORM-style PyMilvus API")
def test_verify_of_an_iceberg_mirror_without_the_flag_through_the_documented_variable(
        milvus_proxy, collection, local_env, tmp_path, monkeypatch, capsys):
    from tests.mq_milvus.collection_log import row

    name, model = collection
    table = str(tmp_path / "mirror")
    _iceberg_copy(milvus_proxy, local_env, name, table)
    model.put([row(6)], "_default")  # the collection moves on: key 6 new, key 2 gone
    model.remove([2])
    cfg = tmp_path / "log.yaml"  # the log only: no milvus.address
    cfg.write_text(f"mq:\n  type: local\nlocal:\n  path: {local_env.config.get('local.path')}\n")
    verify = ["mirror", "verify", "--config", str(cfg), "--collection", name, "--table", table]

    monkeypatch.setenv("MILVUS_ADDRESS", milvus_proxy.address)  # unprefixed: never read
    asked = len(milvus_proxy.state.queries)
    code, _, err = _cli(capsys, *verify)
    assert code == 1 and "config key milvus.address is not set" in err
    assert "MILVUS_ADDRESS in the environment is not read" in err and "MSGSTREAM_MILVUS_ADDRESS=" in err
    assert len(milvus_proxy.state.queries) == asked

    monkeypatch.setenv("MSGSTREAM_MILVUS_ADDRESS", milvus_proxy.address)  # README: sets milvus.address
    code, out, err = _cli(capsys, *verify)
    assert code == 3, err  # different: the Iceberg table was read (as Delta it was "no Delta table at ...")
    assert sorted((p["kind"], p["pk"]) for p in out if "kind" in p) == [("extra", 2), ("missing", 6)]
    summary = out[-1]["summary"]
    assert summary["rows"] == {"milvus": 6, "table": 6} and not summary["equal"]


def test_catalog_flags_name_an_iceberg_catalog_for_every_command(tables, local_env, tmp_path, monkeypatch, capsys):
    """``--catalog NAME`` (pyiceberg's configuration) and ``--catalog-option``: a table named ``namespace.table``
    is found by every command; a Delta table refuses them naming both; a catalog's password never shows."""
    d, _ = tables
    cfg = config_file(local_env, tmp_path)
    monkeypatch.setenv("PYICEBERG_HOME", str(tmp_path))
    monkeypatch.setenv("PYICEBERG_CATALOG__LAKE__TYPE", "sql")
    monkeypatch.setenv("PYICEBERG_CATALOG__LAKE__URI", f"sqlite:///{tmp_path / 'lake.db'}")
    monkeypatch.setenv("PYICEBERG_CATALOG__LAKE__WAREHOUSE", f"file://{tmp_path / 'wh'}")
    made = open_table("iceberg", "shelf.books", collection="c", pk="pk", arrow_schema=SCHEMA, catalog="lake")
    assert made.location == str(tmp_path / "wh" / "shelf" / "books")  # where the catalog put it
    for action in ("orphans", "compact"):
        code, out, err = _cli(capsys, "mirror", action, "--table", "shelf.books", "--catalog", "lake")
        assert code == 0 and out[-1]["format"] == "iceberg", err
    code, out, err = _cli(capsys, "mirror", "status", "--config", cfg, "--table", "shelf.books", "--catalog", "lake",
                          "--checkpoint", str(tmp_path / "cp"))
    assert code == 0 and out[0]["collection"] == "c", err

    code, _, err = _cli(capsys, "mirror", "orphans", "--table", d, "--catalog", "lake")
    assert code == 2 and f"--catalog names an Iceberg catalog, but {d} is a Delta table (a _delta_log/" in err
    code, _, err = _cli(capsys, "mirror", "orphans", "--table", d, "--catalog-option", "uri=x")
    assert code == 2 and "give --catalog NAME too" in err
    code, _, err = _cli(capsys, "mirror", "orphans", "--table", "shelf.books", "--catalog", "lake",
                        "--catalog-option", "password-only")
    assert code == 2 and "--catalog-option #1 is not KEY=VALUE" in err and "password-only" not in err
    code, err = _run(["--config", cfg, "--collection", "c", "--table", "shelf.books", "--catalog", "lake",
                      "--table-format", "delta"], capsys)
    assert code == 2 and "names an Iceberg table, but --table-format is delta" in err
    code, err = _run(["--config", cfg, "--collection", "c", "--table", "shelf.books", "--catalog", "lake"], capsys)
    assert code == 2 and "pass --checkpoint DIR" in err
    code, _, err = _cli(capsys, "mirror", "vacuum", "--table", "shelf.books", "--catalog", "lake", "--dry-run",
                        "--catalog-option", "uri=postgresql+psycopg2://me:pw-Secret-42@127.0.0.1:1/db")
    assert code == 1 and "Iceberg catalog 'lake'" in err and "pw-Secret-42" not in err


@pytest.mark.parametrize("action", ["compact", "orphans", "vacuum"])
def test_a_maintenance_commands_help_shows_its_own_flags(action, capsys):
    """#45 item 9: ``msgstream mirror ACTION --help`` showed a positional ``{compact,orphans,vacuum}`` the user
    must not give (and every action's flags); now the command's name and its own flags only."""
    with pytest.raises(SystemExit) as done:
        main(["mirror", action, "--help"])
    out = capsys.readouterr().out
    assert done.value.code == 0 and out.startswith(f"usage: msgstream mirror {action} [-h] --table LOCATION")
    assert "{compact,orphans,vacuum}" not in out and "positional arguments" not in out
    assert ("--target-mb" in out) == (action == "compact")
    assert ("--retain-hours" in out) == ("--dry-run" in out) == (action == "vacuum")


@pytest.mark.parametrize("fmt", ["delta", "iceberg"])
def test_orphans_says_which_files_are_history_and_which_a_killed_writer_left(fmt, tmp_path, capsys, caplog):
    """#45 item 9: ``mirror orphans`` listed superseded deletion vectors and the files a compaction removed (normal
    history, which vacuum expires) together with what a killed writer left; its JSON now splits them
    (``expired_history``, ``left_by_writers``, with ``kinds`` saying what each is), ``orphans`` stays all of them."""
    from msgstream_spark.mirror.maintenance import compact, orphans
    from msgstream_spark.mirror.write.layout import write_changes
    from tests.mirror.changes import FIELDS, fill, insert, mixed_batches, to_arrow

    loc = str(tmp_path / "t")
    t = open_table(fmt, loc, collection="coll", pk="pk", arrow_schema=FIELDS)
    fill(t, mixed_batches(4))  # Delta: each batch's deletes supersede a file's deletion vector
    compact(t)  # the compacted files leave the current version (Delta) / stay in a kept snapshot (Iceberg)
    lost = write_changes(to_arrow([insert(99, (1, "lost"))]), t.write_spec())  # a batch killed before its commit
    killed = sorted(set(lost.column("_file").drop_null().to_pylist()))
    with caplog.at_level("INFO", logger="msgstream_spark.jobs"):
        code, out, err = _cli(capsys, "mirror", "orphans", "--table", loc)
    assert code == 0, err
    doc = out[-1]
    assert doc["orphans"] == orphans(t) == sorted(doc["expired_history"] + doc["left_by_writers"])
    assert doc["left_by_writers"] == killed
    if fmt == "delta":
        history = doc["expired_history"]
        assert any("deletion_vector_" in p for p in history) and any(p.endswith(".parquet") for p in history)
    else:  # Iceberg's orphans are never history: every snapshot the table keeps is referenced
        assert doc["expired_history"] == []
    assert set(doc["kinds"]) == {"expired_history", "left_by_writers"} and "vacuum" in doc["kinds"]["expired_history"]
    assert f"{len(doc['expired_history'])} of expired history" in caplog.text
    assert f"{len(killed)} left by writers" in caplog.text
