"""The Spark jobs as ``msgstream`` commands, and ``job-path`` (a job's file for ``spark-submit``).

``msgstream ingest|replay|spark-publish|demo ...`` and ``msgstream mirror run ...`` hand the rest of the
command line to the job's own parser: the same flags, JSON summary and exit codes as
``python -m msgstream_spark.jobs.<name>``. The job's module is imported only when its command runs,
so ``msgstream --help`` and the Spark-free commands never load pyspark.

``publish`` keeps its one meaning, the Spark-free publisher of the CLI (rows encoded in this process);
the Spark job that writes through the data source (``msgstream_spark.jobs.publish``) is ``spark-publish``.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
from collections.abc import Sequence

JOBS_PACKAGE = "msgstream_spark.jobs"

# command -> (module in msgstream_spark.jobs, help)
JOB_COMMANDS = {
    "ingest": ("ingest", "Spark job: channels into a table, streaming, exactly once (checkpointed)"),
    "replay": ("replay", "Spark job: a bounded read of channels between positions or times into a table"),
    "spark-publish": ("publish", "Spark job: publish a file's rows (or synthetic ones) through the data source's "
                                 "writer (`publish` does the same without Spark)"),
    "demo": ("demo", "Spark job: publish, ingest, replay and mirror on an embedded log, end to end"),
}
# `msgstream mirror <sub>` that run a Spark job (the mirror's Spark-free subcommands are plain commands)
MIRROR_JOBS = {"run": ("mirror", "Spark job: keep a Delta or Iceberg table equal to a collection "
                                 "(snapshot, then the stream, exactly once)"),
               "compact": ("mirror_maintain", "rewrite a mirror table's files with deleted rows and its small files "
                                              "(one commit; refused while a writer holds the table)"),
               "orphans": ("mirror_maintain", "list the files under a mirror table that no current version references: "
                                              "expired history, and what killed or failed writers left"),
               "vacuum": ("mirror_maintain", "delete orphaned files and those only versions older than "
                                             "--retain-hours use")}
MAINTENANCE = ("compact", "orphans", "vacuum")  # one module: the subcommand is its first argument
# `msgstream job-path <name>`: the commands' names, `mirror` for `mirror run`
JOB_FILES = {**{cmd: mod for cmd, (mod, _) in JOB_COMMANDS.items()}, "mirror": "mirror"}
GLOBAL_FLAGS = ("-v", "--verbose")


def add_job_parsers(sub) -> argparse._SubParsersAction:
    """The job commands (listed in ``msgstream --help``), ``job-path``; returns ``mirror``'s subcommands."""
    for cmd, (mod, help_) in JOB_COMMANDS.items():
        sub.add_parser(cmd, help=help_, add_help=False, usage=_usage(cmd, mod))
    mirror = sub.add_parser("mirror", help="keep a Delta or Iceberg table equal to a collection (`mirror run`)")
    mirror_sub = mirror.add_subparsers(dest="mirror_command", metavar="SUBCOMMAND", required=True)
    for cmd, (mod, help_) in MIRROR_JOBS.items():
        mirror_sub.add_parser(cmd, help=help_, add_help=False, usage=_usage(f"mirror {cmd}", mod))
    p = sub.add_parser("job-path", help="print the file of a Spark job, to give spark-submit "
                                        "(spark-submit ... \"$(msgstream job-path ingest)\" --channels ...)")
    p.add_argument("job", choices=list(JOB_FILES), help="the job's command (mirror: `mirror run`)")
    return mirror_sub


def _usage(cmd: str, mod: str) -> str:
    return f"msgstream {cmd} [job arguments] (see msgstream {cmd} --help; python -m {JOBS_PACKAGE}.{mod})"


def job_in_argv(argv: Sequence[str]) -> tuple[str, str, list[str]] | None:
    """(module, prog, the job's arguments) when ``argv`` names a job command, else None."""
    i = 0
    while i < len(argv) and argv[i] in GLOBAL_FLAGS:  # jobs log at INFO anyway
        i += 1
    if i < len(argv) and argv[i] in JOB_COMMANDS:
        return JOB_COMMANDS[argv[i]][0], f"msgstream {argv[i]}", list(argv[i + 1:])
    if i + 1 < len(argv) and argv[i] == "mirror" and argv[i + 1] in MIRROR_JOBS:
        sub = argv[i + 1]
        rest = [sub, *argv[i + 2:]] if sub in MAINTENANCE else list(argv[i + 2:])
        return MIRROR_JOBS[sub][0], f"msgstream mirror {sub}", rest
    return None


def run_job(module: str, prog: str, argv: list[str]) -> int:
    """Import the job (and so pyspark) now, and run it as ``python -m`` would, named ``prog``."""
    job = importlib.import_module(f"{JOBS_PACKAGE}.{module}")
    return int(job.main(argv, prog) or 0)


def job_file(name: str) -> str:
    """The installed file of the job behind command ``name`` (found without importing the job)."""
    return importlib.util.find_spec(f"{JOBS_PACKAGE}.{JOB_FILES[name]}").origin


def cmd_job_path(args) -> int:
    print(job_file(args.job))
    return 0
