"""``spark-submit jobs/demo.py`` and ``python -m jobs.demo`` from a checkout: ``msgstream_spark.jobs.demo``.

Installed, the same job is ``msgstream demo``; ``msgstream job-path demo`` prints its file (for spark-submit).
"""

from msgstream_spark.jobs.demo import main

if __name__ == "__main__":
    raise SystemExit(main())
