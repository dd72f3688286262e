"""The jobs' launch files of a checkout: ``spark-submit jobs/<name>.py`` and ``python -m jobs.<name>``.

Each file only runs its job from the installed package, ``msgstream_spark.jobs.<name>``; the same jobs
are the ``msgstream`` commands (``msgstream ingest``, ``msgstream mirror run``, ...). This folder is
not installed: a wheel's only top-level names are ``msgstream_spark`` and ``pyspark_msgstream``.
"""
