"""Shared pieces of the jobs: argument helpers, the SparkSession, option plumbing."""

from __future__ import annotations

import argparse
import gc
import json
import logging
import os
import re
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

from msgstream_spark.cli.vocab import add_config_args as add_shared_config_args
from msgstream_spark.cli.vocab import parse_kv
from msgstream_spark.errors import MsgStreamError

log = logging.getLogger("msgstream_spark.jobs")


def add_config_args(p: argparse.ArgumentParser) -> None:
    """``--config``, ``--master`` and ``--option KEY=VALUE`` (``-o``; old: ``--set``): cli/vocab.py."""
    add_shared_config_args(p, options="job", master=True)


def source_options(args, **named: Any) -> dict[str, str]:
    """Data source options from the named arguments (None dropped) and ``--option`` pairs."""
    opts = {k: str(v) for k, v in named.items() if v is not None}
    if getattr(args, "config", None):
        opts["config"] = args.config
    opts.update(parse_kv(getattr(args, "option", [])))
    return opts


def spark_session(app: str, master: str | None = None):
    """The active SparkSession (spark-submit) or a new local one (``python -m``)."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    from pyspark.sql import SparkSession

    b = SparkSession.builder.appName(app)
    if master:
        b = b.master(master)
    b = (b.config("spark.ui.showConsoleProgress", "false")
          .config("spark.sql.session.timeZone", "UTC")
          .config("spark.scheduler.mode", "FAIR"))  # the mirror's snapshots beside the stream: a pool of their own
    spark = b.getOrCreate()
    if os.environ.get("MSGSTREAM_JOBS_QUIET", "1") == "1":
        spark.sparkContext.setLogLevel("ERROR")
    check_driver_python(spark.sparkContext.pythonExec)
    _register(spark)
    return spark


def check_driver_python(python: str) -> None:
    """Fail early when the Python Spark runs for the data source does not exist on the driver.

    A Python data source also runs that interpreter on the driver (read planning, streaming
    offsets, write commits), resolved from the driver's working directory; the cluster recipe's
    ``spark.pyspark.python=./environment/bin/python`` therefore needs the archive unpacked there too.
    """
    if os.sep not in python or os.path.isabs(python) or os.path.exists(python):
        return
    top = python.split(os.sep)[1] if python.startswith("." + os.sep) else python.split(os.sep)[0]
    raise MsgStreamError(
        f"spark.pyspark.python (or PYSPARK_PYTHON) is {python!r}, relative to the working directory, but "
        f"{os.path.abspath(python)} does not exist. Spark runs the msgstream data source's Python on the "
        f"driver as well as on the executors: unpack the archive shipped with --archives into {top}/ in "
        f"the directory you submit from (mkdir -p {top} && tar -xzf <archive> -C {top}).")


def _register(spark) -> None:
    """Register the data source explicitly (static registration misses late installs)."""
    try:
        from msgstream_spark.spark.datasource import MsgStreamDataSource
    except ImportError:  # the Spark source is not installed: nothing to register
        return
    spark.dataSource.register(MsgStreamDataSource)


def main_wrapper(parser: argparse.ArgumentParser, run: Callable[[argparse.Namespace], Any],
                 argv: Sequence[str] | None = None, prog: str | None = None) -> int:
    """Parse ``argv``, run, print the summary as JSON; errors -> one line on stderr, exit 1.

    ``prog`` names the command in usage and error lines (``msgstream ingest``; default: the job's name).
    """
    if prog:
        parser.prog = prog
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format=f"{parser.prog}: %(message)s")
    try:
        summary = run(args)
    except argparse.ArgumentTypeError as exc:
        parser.error(str(exc))
    except MsgStreamError as exc:
        print(f"{parser.prog}: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    except Exception as exc:  # noqa: BLE001 - Spark wraps our errors; show the root line
        msg = spark_error_line(exc)
        if msg is None:
            raise
        print(f"{parser.prog}: error: {msg}", file=sys.stderr)
        return 1
    if summary is not None:
        print(json.dumps(summary, indent=2, sort_keys=True, default=str))
    return 0


def spark_error_line(exc: BaseException) -> str | None:
    """The msgstream error inside a Spark exception (Python worker traceback text), if any."""
    text = str(exc)
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("msgstream_spark.errors."):
            name, _, rest = line.partition(": ")
            return f"{name.rsplit('.', 1)[-1]}: {rest}"
    if type(exc).__module__.startswith(("pyspark", "py4j")):
        java = getattr(exc, "java_exception", None)
        if java is not None:  # Py4JJavaError: the Java exception's own message says what failed
            try:
                text = str(java.toString())
            except Exception as err:  # noqa: BLE001 - the gateway may be gone
                log.debug("cannot read the Java exception: %s", err)
            for line in text.splitlines():
                if line.strip().startswith("msgstream_spark.errors."):
                    name, _, rest = line.strip().partition(": ")
                    return f"{name.rsplit('.', 1)[-1]}: {rest}"
        first = text.strip().splitlines()[0] if text.strip() else type(exc).__name__
        return first[:500]
    return None


_UNITS = {"ms": "milliseconds", "s": "seconds", "sec": "seconds", "m": "minutes", "min": "minutes", "h": "hours"}


def _interval(value: str, text: str) -> str:
    """``10``, ``10s``, ``500ms``, ``2m``, ``10 seconds`` -> Spark's interval text."""
    m = re.fullmatch(r"(\d+)\s*([a-z]*)", value.lower())
    if not m:
        raise argparse.ArgumentTypeError(f"--trigger: bad interval in {text!r} (e.g. processing-time:10s)")
    n, unit = m.groups()
    unit = _UNITS.get(unit or "s", unit)
    if unit not in ("milliseconds", "seconds", "minutes", "hours", "second", "minute", "hour"):
        raise argparse.ArgumentTypeError(f"--trigger: unknown interval unit in {text!r} (ms, s, m, h)")
    return f"{n} {unit}"


def trigger_kwargs(text: str) -> dict[str, Any]:
    """``available-now`` | ``once`` | ``processing-time:<interval>`` -> DataStreamWriter.trigger kwargs."""
    t = (text or "available-now").strip()
    low = t.lower()
    if low in ("available-now", "availablenow", "available_now"):
        return {"availableNow": True}
    if low == "once":
        return {"once": True}
    if low.startswith(("processing-time:", "processingtime:", "processing-time=")):
        interval = t.split(":", 1)[1] if ":" in t else t.split("=", 1)[1]
        return {"processingTime": _interval(interval.strip(), text)}
    raise argparse.ArgumentTypeError(
        f"--trigger must be available-now, once or processing-time:<interval> (e.g. processing-time:10s), "
        f"got {text!r}")


@contextmanager
def long_lived() -> Iterator[None]:
    """A long-running job's run: the objects that exist when it starts (modules, the Spark session, the tables it
    opened) are set aside from the garbage collector's full collections (``gc.freeze``) until it ends. A full
    collection otherwise walks every object of the driver: ~150 ms with pyspark, pyiceberg and 20 tables loaded,
    paid by whichever batch's thread triggers it; frozen, it walks only what the run made since. Nothing is
    frozen when something else in the process already froze objects (it owns the freeze); the end unfreezes, so
    garbage among them is collected then."""
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
