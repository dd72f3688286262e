"""A spark-submit app that runs the mirror job (``msgstream_spark.jobs.mirror``, as ``job-path mirror`` runs it)
several times back to back in one application: one driver and its executors for several tables.

Run by tests/cluster/test_cluster_jobs.py: ``mirror_runs.py ARGV... [-- ARGV...]...``, each ``--``-separated part
the arguments of one run; the test failpoint ``MSGSTREAM_MIRROR_FAILPOINT`` of the driver's environment applies to
the first run only. Each run's summary is printed as one line ``SUMMARY <json>``. With ``--probe PYTHON`` first,
the application then reports where executors find msgstream_spark, with the shipped environment and with the
worker's bare interpreter ``PYTHON`` (``run_probe``), as one line ``PROBE <json>``.
"""

import json
import os
import sys


def where(_):
    """A task's report: its interpreter, working directory and where ``import msgstream_spark`` finds it."""
    import os
    import sys

    try:
        import msgstream_spark.spark.datasource as ds

        found = ds.__file__
    except ImportError as exc:
        found = f"ImportError: {exc}"
    yield {"python": sys.executable, "realpath": os.path.realpath(sys.executable), "cwd": os.getcwd(),
           "msgstream_spark": found}


def run_probe(sc, bare_python: str) -> dict:
    """One task in the app's Python (the shipped environment), then one in ``bare_python`` (the context keeps
    pointing at it: run last)."""
    shipped = sc.parallelize([0], 1).mapPartitions(where).collect()[0]
    sc.pythonExec = bare_python  # the worker's own interpreter for the next task
    bare = sc.parallelize([0], 1).mapPartitions(where).collect()[0]
    return {"shipped": shipped, "bare": bare}


def main(argv: list[str]) -> int:
    from job_runs import split_runs  # beside this file (the script's directory is first on sys.path)

    from msgstream_spark.jobs import mirror
    from msgstream_spark.spark.mirror import FAILPOINT_ENV

    probe = None
    if argv[:1] == ["--probe"]:
        probe, argv = argv[1], argv[2:]
    for i, args in enumerate(split_runs(argv)):
        if i:
            os.environ.pop(FAILPOINT_ENV, None)
        summary = mirror.run(mirror.build_parser().parse_args(args))
        print("SUMMARY " + json.dumps(summary, default=str), flush=True)
    if probe is not None:  # last: it points the context's Python at the bare interpreter
        from pyspark.sql import SparkSession

        print("PROBE " + json.dumps(run_probe(SparkSession.getActiveSession().sparkContext, probe)), flush=True)
    return 0


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="mirror: %(message)s")
    rc = main(sys.argv[1:])
    from pyspark.sql import SparkSession

    SparkSession.getActiveSession().stop()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(rc)  # as the job: delta-rs can abort the process at interpreter exit (delta-rs issue 2184)
