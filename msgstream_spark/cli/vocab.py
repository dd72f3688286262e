"""The flags every ``msgstream`` command shares, defined once (docs/sink-jobs-cli.md, "One vocabulary").

The rules: one concept, one flag, in the Spark-free commands and in the jobs alike.

* ``--config FILE`` and repeatable ``--option KEY=VALUE`` (``-o``): a dotted key (``kafka.brokerList``) is a config
  key; an undotted one (``maxRowsPerTrigger``) a data-source option, taken by the commands that read or write
  through the data source. Old spelling: ``--set``.
* ``--channels A,B`` (``-c``) is a comma-separated list of channel names everywhere; a count of things is
  ``--num-<things>`` (``--num-channels``, ``--num-rows``, ``--num-tasks``, ``--num-buckets``).
* ``--from`` / ``--to`` are where a read starts and ends (earliest, latest, positions, ``@file``);
  ``--from-timestamp`` / ``--to-timestamp`` the same as times.
* ``--table LOCATION`` with ``--table-format`` is the table a job writes or a mirror command reads
  (cli/table_args.py holds the mirror's).

An old spelling keeps working: it prints ``<prog>: warning: <old> is deprecated, use <new>`` on stderr and sets
what the new one sets.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any


class UsageError(argparse.ArgumentTypeError):
    """Bad combination of arguments (exit code 2); the jobs' parser reports it as a usage error too."""


class Deprecated(argparse.Action):
    """An old spelling of a flag: warns on stderr naming the new spelling, then stores (or appends) like it."""

    def __init__(self, option_strings: Sequence[str], dest: str, new: str = "", append: bool = False,
                 **kw: Any) -> None:
        super().__init__(option_strings, dest, **kw)
        self.new = new
        self.append = append

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        old = option_string or self.option_strings[0]
        warned = parser.__dict__.setdefault("_deprecated_warned", set())
        if old not in warned:  # once per spelling and parse: ``--set a=1 --set b=2`` warns once
            warned.add(old)
            warn_deprecated(parser.prog, old, self.new)
        if self.append:
            values = [*(getattr(namespace, self.dest, None) or []), values]
        setattr(namespace, self.dest, values)


def warn_deprecated(prog: str, old: str, new: str) -> None:
    print(f"{prog}: warning: {old} is deprecated, use {new}", file=sys.stderr, flush=True)


def add_flag(p, names: Sequence[str], *, old: Iterable[str] = (), **kw: Any) -> argparse.Action:
    """``p.add_argument(*names, **kw)`` plus each of ``old`` as a deprecated spelling (hidden from ``--help``).
    A required flag and its old spellings form a required group: one of them is needed, not the new one."""
    old = list(old)
    if kw.get("required") and old:
        p = p.add_mutually_exclusive_group(required=True)
        kw["required"] = False
    act = p.add_argument(*names, **kw)
    for spelling in old:
        p.add_argument(spelling, dest=act.dest, action=Deprecated, new=names[0],
                       append=isinstance(act, argparse._AppendAction), type=act.type, choices=act.choices,
                       metavar=act.metavar, help=argparse.SUPPRESS)
    return act


def key_value(text: str) -> str:
    """argparse type of ``--option``: ``KEY=VALUE`` with a non-empty key (the text is kept)."""
    key, sep, _ = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(f"expects KEY=VALUE, got {text!r}")
    return text


def parse_kv(items: Iterable[str] | None, what: str = "--option") -> dict[str, str]:
    """``["k=v", ...]`` -> ``{"k": "v"}`` (a later pair wins)."""
    out: dict[str, str] = {}
    for item in items or []:
        k, sep, v = item.partition("=")
        if not sep or not k.strip():
            raise UsageError(f"{what} expects KEY=VALUE, got {item!r}")
        out[k.strip()] = v
    return out


def is_config_key(key: str) -> bool:
    """A config key is dotted (``section.key``); data-source options are not (``maxRowsPerTrigger``)."""
    return "." in key.strip(".")


def config_overrides(args: argparse.Namespace) -> dict[str, str]:
    """The config keys of ``--option``."""
    return {k: v for k, v in parse_kv(getattr(args, "option", None)).items() if is_config_key(k)}


def data_options(args: argparse.Namespace) -> dict[str, str]:
    """The data-source options of ``--option`` (its undotted keys)."""
    return {k: v for k, v in parse_kv(getattr(args, "option", None)).items() if not is_config_key(k)}


def config_only(args: argparse.Namespace, command: str) -> dict[str, str]:
    """The ``--option`` pairs of a command that reads no data-source option: config keys, else UsageError."""
    other = data_options(args)
    if other:
        raise UsageError(f"--option {', '.join(sorted(other))}: msgstream {command} takes config keys only "
                         "(dotted, e.g. --option kafka.brokerList=host:9092); data-source options go to "
                         "msgstream rows and the jobs")
    return config_overrides(args)


OPTION_HELP = {
    "config": "a config key overriding the file, e.g. -o kafka.brokerList=127.0.0.1:9092 (repeatable)",
    "read": "a config key (dotted, e.g. kafka.brokerList=h:9092) or a read option of the Spark source "
            "(docs/spark-source.md, e.g. -o endingTimestamp=...) (repeatable)",
    "write": "a config key (dotted, e.g. kafka.brokerList=h:9092) or a sink option (docs/sink-jobs-cli.md, "
             "e.g. -o timeTick=written) (repeatable)",
    "job": "a config key (dotted, e.g. kafka.brokerList=h:9092) or a msgstream data source option "
           "(repeatable)",
}


def add_config_args(p, *, options: str = "config", master: bool = False) -> None:
    """``--config``, ``--option``/``-o`` (old: ``--set``) and, for the Spark jobs, ``--master``.
    ``options``: what ``--option`` takes, a key of :data:`OPTION_HELP`."""
    p.add_argument("--config", default=None,
                   help="YAML config (same keys as milvus.yaml; e.g. conf/msgstream.yaml); default: the packaged "
                        "embedded-log config")
    if master:
        p.add_argument("--master", default=None, help="Spark master when not run by spark-submit (default local[*])")
    add_flag(p, ("--option", "-o"), old=("--set",), action="append", default=[], type=key_value,
             metavar="KEY=VALUE", help=OPTION_HELP[options])


def add_channels_arg(p, *, required: bool = True, meaning: str | None = None) -> None:
    """``--channels``/``-c``: a comma-separated list of channel names (pchannels)."""
    p.add_argument("--channels", "-c", required=required, metavar="A,B",
                   help=meaning or "comma-separated channel names (pchannels)")


def split_channels(text: str | None) -> list[str]:
    """``--channels`` as a list; UsageError when given but empty."""
    chans = [c.strip() for c in (text or "").split(",") if c.strip()]
    if text is not None and not chans:
        raise UsageError("--channels is empty")
    return chans


def at_file(value: str | None) -> str | None:
    """``--from`` / ``--to``: ``@path`` is the file's content (positions saved by ``position``, the demo or a
    Milvus checkpoint dump); anything else is the value itself."""
    if value and value.startswith("@"):
        path = Path(value[1:])
        if not path.is_file():
            raise UsageError(f"positions file not found: {path} (from {value!r})")
        return path.read_text().strip()
    return value
