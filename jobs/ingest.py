"""``spark-submit jobs/ingest.py`` and ``python -m jobs.ingest`` from a checkout: ``msgstream_spark.jobs.ingest``.

Installed, the same job is ``msgstream ingest``; ``msgstream job-path ingest`` prints its file (for spark-submit).
"""

from msgstream_spark.jobs.ingest import main

if __name__ == "__main__":
    raise SystemExit(main())
