"""``python -m msgstream_spark ...`` is the ``msgstream`` command (for an environment whose scripts were moved,
as a packed one unpacked on a cluster: ``./environment/bin/python -m msgstream_spark job-path ingest``)."""

import sys

from msgstream_spark.cli.main import main

sys.exit(main())
