"""Read-only backend over a Milvus 2.6 proxy's ``DumpMessages`` WAL stream."""
