"""The ``msgstream`` command line tool (console script ``msgstream``)."""
