"""spark-submit jobs: ``ingest``, ``replay``, ``publish`` and the ``demo``.

Each runs with ``python -m jobs.<name>`` and with ``spark-submit jobs/<name>.py``.
"""
