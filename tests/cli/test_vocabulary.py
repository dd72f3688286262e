"""One vocabulary for every ``msgstream`` command (issue #38 item 8), from the CLI's own entry points.

Old spellings map to the new ones with a deprecation message on stderr naming the new one; the new ones work;
wrong combinations are usage errors naming the option. In-process: ``main()`` for the Spark-free commands, and
for the jobs the parser the CLI hands their arguments to (``job_in_argv``; none of them starts Spark here).
"""

from __future__ import annotations

import importlib
import json
import re

import pytest

from msgstream_spark.cli import job_commands
from msgstream_spark.cli.main import build_parser, main
from tests.sink.helpers import config_file

# command words, old arguments, the same in the new vocabulary, the renamed flags (old -> new)
SET = ("--set", "--option")
RENAMED = [
    (("channels",), ["--set", "mq.type=local"], ["--option", "mq.type=local"], [SET]),
    (("tail",), ["-c", "a", "--set", "kafka.brokerList=h:1"], ["-c", "a", "-o", "kafka.brokerList=h:1"], [SET]),
    (("position",), ["-c", "a", "--set", "a.b=1", "--set", "c.d=2"], ["-c", "a", "-o", "a.b=1", "-o", "c.d=2"],
     [SET, SET]),
    (("rows",), ["-c", "a", "--set", "a.b=1"], ["-c", "a", "--option", "a.b=1"], [SET]),
    (("publish",), ["-c", "a", "--synthetic", "1", "--set", "timeTick=none"],
     ["-c", "a", "--synthetic", "1", "-o", "timeTick=none"], [SET]),
    (("inspect",), ["--base64", "AA==", "--set", "a.b=1"], ["--base64", "AA==", "-o", "a.b=1"], [SET]),
    (("mirror", "verify"), ["--collection", "c", "--table", "t", "--buckets", "8", "--set", "milvus.address=h:1"],
     ["--collection", "c", "--table", "t", "--num-buckets", "8", "-o", "milvus.address=h:1"],
     [("--buckets", "--num-buckets"), SET]),
    (("mirror", "status"), ["--table", "t", "--set", "a.b=1"], ["--table", "t", "-o", "a.b=1"], [SET]),
    (("ingest",), ["-c", "a", "--output", "o", "--format", "json", "--starting", "latest", "--set", "a.b=1"],
     ["-c", "a", "--table", "o", "--table-format", "json", "--from", "latest", "-o", "a.b=1"],
     [("--output", "--table"), ("--format", "--table-format"), ("--starting", "--from"), SET]),
    (("replay",), ["--channels", "a", "--output", "o", "--format", "json", "--from-ts", "5", "--to-ts", "9"],
     ["-c", "a", "--table", "o", "--table-format", "json", "--from-timestamp", "5", "--to-timestamp", "9"],
     [("--output", "--table"), ("--format", "--table-format"), ("--from-ts", "--from-timestamp"),
      ("--to-ts", "--to-timestamp")]),
    (("spark-publish",), ["--channels", "a", "--synthetic", "1", "--partitions", "3"],
     ["-c", "a", "--synthetic", "1", "--num-tasks", "3"], [("--partitions", "--num-tasks")]),
    (("demo",), ["--rows", "10", "--more-rows", "5", "--partitions", "1"],
     ["--num-rows", "10", "--num-more-rows", "5", "--num-tasks", "1"],
     [("--rows", "--num-rows"), ("--more-rows", "--num-more-rows"), ("--partitions", "--num-tasks")]),
    (("mirror", "run"), ["--collection", "c", "--table", "t", "--starting", "earliest", "--snapshot-tasks", "2",
                         "--set", "milvus.address=h:1"],
     ["--collection", "c", "--table", "t", "--from", "earliest", "--num-snapshot-tasks", "2", "-o",
      "milvus.address=h:1"],
     [("--starting", "--from"), ("--snapshot-tasks", "--num-snapshot-tasks"), SET]),
]


def parse(words: tuple[str, ...], argv: list[str]) -> dict:
    """What the command parses ``argv`` into, on the CLI's own path (a job's parser for a job command)."""
    job = job_commands.job_in_argv([*words, *argv])
    if job is None:
        return vars(build_parser().parse_args([*words, *argv]))
    module, prog, rest = job
    parser, rest = _job_parser(module, rest)
    parser.prog = prog
    return vars(parser.parse_args(rest))


def _job_parser(module: str, rest: list[str]):
    """A job's parser and the arguments it parses: ``mirror compact|orphans|vacuum`` have one each (the module's
    main takes the action from its first argument)."""
    job = importlib.import_module(f"msgstream_spark.jobs.{module}")
    if module == "mirror_maintain":
        return job.build_parser(rest[0]), rest[1:]
    return job.build_parser(), rest


@pytest.mark.parametrize("words,old,new,renamed", RENAMED, ids=[" ".join(r[0]) for r in RENAMED])
def test_an_old_spelling_maps_to_the_new_one_with_a_deprecation_message(words, old, new, renamed, capsys):
    got_new = parse(words, new)
    assert capsys.readouterr().err == ""
    got_old = parse(words, old)
    err = capsys.readouterr().err
    assert got_old == got_new
    prog = "msgstream " + " ".join(words)
    once = dict.fromkeys(renamed)  # each old spelling warns once, however often it is given
    assert err.splitlines() == [f"{prog}: warning: {o} is deprecated, use {n}" for o, n in once]


def _commands() -> dict[str, object]:
    """Every command's parser, by its words."""
    cli = build_parser()
    sub = next(a for a in cli._actions if a.dest == "command").choices
    out = {name: p for name, p in sub.items() if name not in job_commands.JOB_COMMANDS and name != "mirror"}
    out.update({f"mirror {name}": p for name, p in next(a for a in sub["mirror"]._actions
                                                          if a.dest == "mirror_command").choices.items()
                if name not in job_commands.MIRROR_JOBS})
    for words in [*([c] for c in job_commands.JOB_COMMANDS), *(["mirror", c] for c in job_commands.MIRROR_JOBS)]:
        module, _, rest = job_commands.job_in_argv(words)
        out[" ".join(words)] = _job_parser(module, rest)[0]
    return out


def _option(parser, flag: str):
    return next((a for a in parser._actions if flag in a.option_strings), None)


def test_every_command_speaks_one_vocabulary():
    """The same concept has the same flag in every command: a command with --config has --option (-o);
    --channels (-c) is a list of names; a count is --num-...; every mirror command has the one table helper's
    --table, --table-format (detected by default) and --catalog-uri."""
    commands = _commands()
    assert len(commands) == 17
    for name, p in commands.items():
        flags = {f for a in p._actions for f in a.option_strings if a.help != "==SUPPRESS=="}
        if "--config" in flags:
            assert {"--option", "-o"} <= flags, name
        channels = _option(p, "--channels")
        if channels is not None and name != "channels":
            assert channels.option_strings == ["--channels", "-c"] and channels.metavar == "A,B", name
            assert channels.type is None, name  # names, not a number
        plural_counts = [f for a in p._actions if a.type is int and a.help != "==SUPPRESS=="
                         for f in a.option_strings if re.fullmatch(r"--[a-z]+s", f)]
        assert not plural_counts, name  # --channels, --rows, --partitions, --buckets: never a number
        old = {"--set", "--output", "--starting", "--from-ts", "--partitions", "--buckets"} - {
            "--output" if name == "rows" else ""}  # rows --output rows|messages: the read option "output"
        assert not old & flags, name
        if name.startswith("mirror "):
            helper = [_option(p, f) for f in ("--table", "--table-format", "--catalog-uri")]
            assert all(helper) and helper[1].default is None, name
            same = [_option(commands["mirror verify"], a.option_strings[0]).help for a in helper]
            assert helper[0].help == same[0] and helper[2].help == same[2], name
            assert helper[1].help.startswith(same[1].rstrip(")")), name  # run adds: required to create a table


def test_verify_help_shows_the_real_catalog_default(tmp_path, capsys):
    """verify once said the default catalog was "a SQLite file in the table's location"; it is the file made
    next to the table, the same text in every mirror command."""
    import pyarrow as pa

    from msgstream_spark.mirror.table import open_table

    open_table("iceberg", str(tmp_path / "books"), collection="books", pk="pk",
               arrow_schema=pa.schema([("pk", pa.int64())]), create=True)
    assert (tmp_path / "books_catalog.sqlite").is_file()
    for words in (["mirror", "verify"], ["mirror", "status"], ["mirror", "compact"], ["mirror", "run"]):
        with pytest.raises(SystemExit) as done:
            main([*words, "--help"])
        assert done.value.code == 0
        text = " ".join(capsys.readouterr().out.split())
        assert "default: the SQLite file <table>_catalog.sqlite next to the table" in text, words
        assert "in the table's location" not in text


# -- the new spellings work ----------------------------------------------------------------------------------------
def _cli(capsys, *argv: str) -> tuple[int, list, str]:
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, [json.loads(line) for line in out.splitlines() if line.strip()], err


def test_option_sets_config_keys_and_data_source_options(local_env, tmp_path, capsys):
    db = local_env.config.get("local.path")
    ch = local_env.new_channel("vocab")
    keys = ["-o", "mq.type=local", "-o", f"local.path={db}"]  # the config as --option keys alone
    code, out, err = _cli(capsys, "publish", *keys, "-c", ch, "--synthetic", "20", "--dim", "2", "--no-progress",
                          "--option", "timeTick=none")  # a sink option: no closing time tick
    assert code == 0 and err == "", err
    published = out[-1]["channels"][ch]["messages"]
    code, out, err = _cli(capsys, "channels", *keys, "-c", ch)
    assert code == 0 and err == "" and out[0]["messages"] == published  # no tick was written
    code, rows, err = _cli(capsys, "rows", *keys, "-c", ch, "-o", "messageTypes=insert", "-n", "3")
    assert code == 0 and err == "" and [r["pk"] for r in rows] == [0, 1, 2]
    code, old, err = _cli(capsys, "position", "--set", "mq.type=local", "--set", f"local.path={db}", "-c", ch)
    assert code == 0 and err.count("warning: --set is deprecated") == 1, err  # once, not once per --set
    assert "msgstream position: warning: --set is deprecated, use --option" in err
    assert old == _cli(capsys, "position", "--config", config_file(local_env, tmp_path), "-c", ch)[1]


def test_wrong_options_are_usage_errors_naming_the_option(local_env, tmp_path, capsys):
    code, _, err = _cli(capsys, "tail", "-o", "startingPositions=latest", "-c", "x")
    assert code == 2 and "msgstream tail: error: --option startingPositions" in err and "config keys only" in err
    for argv in (["tail", "-c", "x", "--option", "kafka.brokerList"], ["position", "-c", "x", "--set", "=v"]):
        with pytest.raises(SystemExit) as done:
            main(argv)
        assert done.value.code == 2
        assert "expects KEY=VALUE" in capsys.readouterr().err
    with pytest.raises(SystemExit) as done:
        parse(("replay",), ["-c", "a", "--table", "t", "--from", "earliest", "--from-ts", "5"])
    assert done.value.code == 2 and "not allowed with argument --from" in capsys.readouterr().err


def test_demo_channels_are_names_and_the_old_count_is_deprecated(capsys):
    from msgstream_spark.cli.vocab import UsageError
    from msgstream_spark.jobs.demo import channel_names

    assert channel_names(parse(("demo",), []) and _ns("demo", [])) == ["demo-dml_0", "demo-dml_1"]
    assert channel_names(_ns("demo", ["--num-channels", "3"])) == ["demo-dml_0", "demo-dml_1", "demo-dml_2"]
    assert channel_names(_ns("demo", ["--channels", "a,b"])) == ["a", "b"]
    capsys.readouterr()
    old = _ns("demo", ["--channels", "3"])
    assert "msgstream demo: warning: --channels 3 (a count) is deprecated, use --num-channels 3" in \
        capsys.readouterr().err
    assert channel_names(old) == ["demo-dml_0", "demo-dml_1", "demo-dml_2"]
    with pytest.raises(UsageError, match="--channels A,B and --num-channels N"):
        channel_names(_ns("demo", ["--channels", "a,b", "--num-channels", "2"]))


def _ns(command: str, argv: list[str]):
    from types import SimpleNamespace

    return SimpleNamespace(**parse((command,), argv))
