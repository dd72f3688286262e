"""The suite's own Milvus proxy: ``Connect``, ``DescribeCollection`` and ``DumpMessages`` over an embedded log.

See :mod:`tests.milvus_proxy.server` for what it copies from Milvus and what it simplifies.
"""
