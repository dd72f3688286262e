"""The snapshot through Milvus's ``Query`` RPC: key ranges, calls, answers decoded column-wise."""
