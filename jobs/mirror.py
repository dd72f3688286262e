"""``spark-submit jobs/mirror.py`` and ``python -m jobs.mirror`` from a checkout: ``msgstream_spark.jobs.mirror``.

Installed, the same job is ``msgstream mirror run``; ``msgstream job-path mirror`` prints its file (for spark-submit).
"""

from msgstream_spark.jobs.mirror import main

if __name__ == "__main__":
    raise SystemExit(main())
