"""The Spark jobs: ``ingest``, ``replay``, ``mirror``, ``publish`` (through Spark) and the ``demo``.

Each is a command of the ``msgstream`` CLI (``msgstream ingest``, ``msgstream replay``, ``msgstream mirror run``,
``msgstream spark-publish``, ``msgstream demo``), runs with ``python -m msgstream_spark.jobs.<name>``, and is a
file ``spark-submit`` accepts (``msgstream job-path <name>`` prints it).
"""
