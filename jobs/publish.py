"""``spark-submit jobs/publish.py`` and ``python -m jobs.publish`` from a checkout: ``msgstream_spark.jobs.publish``.

Installed, the same job is ``msgstream spark-publish``; ``msgstream job-path spark-publish`` prints its file.
"""

from msgstream_spark.jobs.publish import main

if __name__ == "__main__":
    raise SystemExit(main())
