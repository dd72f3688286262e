"""``spark-submit jobs/replay.py`` and ``python -m jobs.replay`` from a checkout: ``msgstream_spark.jobs.replay``.

Installed, the same job is ``msgstream replay``; ``msgstream job-path replay`` prints its file (for spark-submit).
"""

from msgstream_spark.jobs.replay import main

if __name__ == "__main__":
    raise SystemExit(main())
