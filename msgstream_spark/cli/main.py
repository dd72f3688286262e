"""``msgstream``: inspect and feed Milvus message streams from the shell.

Subcommands: ``channels``, ``publish``, ``tail``, ``rows``, ``position``, ``inspect``. All accept
``--config`` and ``--option KEY=VALUE`` (cli/vocab.py: the flags every command shares, old spellings
deprecated). Errors print one line on stderr and exit non-zero (2 for usage errors).
The Spark jobs are commands too (``ingest``, ``replay``, ``spark-publish``, ``demo``, ``mirror run``;
cli/job_commands.py), and ``job-path`` prints a job's file for ``spark-submit``.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from msgstream_spark.cli import commands, job_commands, mirror_cmds
from msgstream_spark.cli.publish_args import add_publish_args
from msgstream_spark.cli.rows import add_rows_parser
from msgstream_spark.cli.vocab import add_channels_arg, add_config_args
from msgstream_spark.errors import MsgStreamError

EXIT_ERROR = 1
EXIT_USAGE = 2
EXIT_INTERRUPTED = 130


def _common(p: argparse.ArgumentParser, options: str = "config") -> None:
    """``--config`` and ``--option`` (``options``: what ``--option`` takes, cli/vocab.py OPTION_HELP)."""
    add_config_args(p, options=options)
    p.set_defaults(option_kind=options)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="msgstream", description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true", help="log at INFO level on stderr")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)

    p = sub.add_parser("channels", help="list channels with latest position and message count")
    _common(p)
    add_channels_arg(p, required=False, meaning="only these channels (comma-separated); default: all")
    p.add_argument("--collection", action="append", default=[], metavar="[DB.]NAME",
                   help="mq.type=milvus: list this collection's pchannels and vchannels (repeatable)")
    p.add_argument("--no-count", action="store_true", help="skip counting messages (counting reads the channel)")
    p.add_argument("--timeout", type=float, default=30.0, help="seconds allowed for counting one channel")

    p = sub.add_parser("publish", help="publish a file's (or synthetic) rows as inserts, no Spark (see spark-publish)")
    _common(p, "write")
    add_channels_arg(p)
    add_publish_args(p)
    p.add_argument("--batch-rows", type=int, default=10_000, help="rows encoded per step (default 10000)")
    p.add_argument("--no-progress", action="store_true", help="no progress bar on stderr")

    p = sub.add_parser("tail", help="decode and print messages as JSON lines")
    _common(p)
    add_channels_arg(p)
    where = p.add_mutually_exclusive_group()
    where.add_argument("--from", dest="start", default="earliest", metavar="POSITIONS",
                       help="earliest (default), latest, a position (JSON or base64 MsgPosition, or @file holding "
                            "it), or a Milvus 2.6 resume point of the one channel: checkpoint:<base64 WALCheckpoint> "
                            "or message-id:<JSON {id, wal_name} or base64 MessageID>")
    where.add_argument("--from-timestamp", dest="from_timestamp", metavar="TS",
                       help="hybrid timestamp or ISO-8601 time: from the first message whose own Milvus "
                            "time is at or after it")
    p.add_argument("--limit", "-n", type=int, help="stop after this many messages")
    p.add_argument("--follow", "-f", action="store_true", help="keep waiting for new messages (Ctrl-C stops)")
    p.add_argument("--timeout", type=float, default=2.0,
                   help="without --follow: stop when nothing arrives for this many seconds (default 2)")
    p.add_argument("--rows", action="store_true", help="include the decoded rows of inserts and deletes")
    p.add_argument("--no-ticks", action="store_true", help="hide TimeTick messages")

    add_rows_parser(sub, _common)

    p = sub.add_parser("position", help="latest or at-timestamp MsgPosition (JSON and base64 protobuf)")
    _common(p)
    add_channels_arg(p)
    p.add_argument("--at", help="hybrid timestamp, or ISO-8601 time: position of the first message at or "
                                "after it (default: the latest message)")

    p = sub.add_parser("inspect", help="decode one raw payload (file or base64)")
    _common(p)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--file", help="file holding the raw payload bytes")
    src.add_argument("--base64", help="the raw payload as base64")
    p.add_argument("--msg-type", help="msg_type property (e.g. Insert) when the payload lacks a header")
    p.add_argument("--property", action="append", default=[], metavar="KEY=VALUE",
                   help="a property the message was sent with (repeatable), e.g. the 2.6 WAL keys _v, _t, _tt, "
                        "_vc, _h; a flag is KEY=")
    p.add_argument("--properties", metavar="JSON", help="the properties as a JSON object of strings")
    p.add_argument("--rows", action="store_true", help="include decoded rows")
    mirror_cmds.add_mirror_commands(job_commands.add_job_parsers(sub), _common)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    job = job_commands.job_in_argv(argv)
    if job is not None:  # the job parses its own arguments and prints its own summary and errors
        return job_commands.run_job(*job)
    parser = build_parser()
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO if args.verbose else logging.WARNING, stream=sys.stderr,
                        format="msgstream: %(levelname)s: %(message)s")

    name = " ".join(w for w in (args.command, getattr(args, "mirror_command", None)) if w)
    try:
        return int(commands.run(args) or 0)
    except KeyboardInterrupt:
        print("msgstream: interrupted", file=sys.stderr)
        return EXIT_INTERRUPTED
    except BrokenPipeError:
        return 0
    except MsgStreamError as exc:
        print(f"msgstream {name}: error: {_one_line(exc)}", file=sys.stderr)
        return EXIT_ERROR
    except commands.UsageError as exc:  # argparse.ArgumentTypeError: the jobs report it as usage too
        print(f"msgstream {name}: error: {exc}", file=sys.stderr)
        return EXIT_USAGE


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split()) or type(exc).__name__


if __name__ == "__main__":
    sys.exit(main())
