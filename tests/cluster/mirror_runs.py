"""A spark-submit app that runs the mirror job (``msgstream_spark.jobs.mirror``, as ``job-path mirror`` runs it)
several times back to back in one application: one driver and its executors for several tables.

Run by tests/cluster/test_cluster_jobs.py: ``mirror_runs.py ARGV... [-- ARGV...]...``, each ``--``-separated part
the arguments of one run; the test failpoint ``MSGSTREAM_MIRROR_FAILPOINT`` of the driver's environment applies to
the first run only. Each run's summary is printed as one line ``SUMMARY <json>``.
"""

import json
import os
import sys


def main(argv: list[str]) -> int:
    from msgstream_spark.jobs import mirror
    from msgstream_spark.spark.mirror import FAILPOINT_ENV

    runs, part = [], []
    for a in argv:
        if a == "--":
            runs.append(part)
            part = []
        else:
            part.append(a)
    runs.append(part)
    for i, args in enumerate(runs):
        if i:
            os.environ.pop(FAILPOINT_ENV, None)
        summary = mirror.run(mirror.build_parser().parse_args(args))
        print("SUMMARY " + json.dumps(summary, default=str), flush=True)
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
