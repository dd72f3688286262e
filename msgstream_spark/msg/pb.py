"""Milvus's generated protobuf modules (shipped in ``pymilvus.grpc_gen``), loaded lightly.

Importing ``pymilvus`` runs its client ``__init__`` (pandas, grpc: ~1 s), which every Spark
Python worker would pay. The generated ``*_pb2`` modules need only protobuf, so they are
loaded from the same files under a private package name. If pymilvus is already imported,
its own modules are used, so both share one set of classes.
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import sys
import types

_PKG = "msgstream_spark._milvus_pb"


def _load(name: str):
    if "pymilvus.grpc_gen" in sys.modules or (_PKG not in sys.modules and "pymilvus" in sys.modules):
        return importlib.import_module(f"pymilvus.grpc_gen.{name}")
    if _PKG not in sys.modules:
        spec = importlib.util.find_spec("pymilvus")
        if spec is None or spec.origin is None:
            raise ImportError("msgstream-spark needs the 'pymilvus' package for Milvus's protobuf definitions")
        pkg = types.ModuleType(_PKG)
        pkg.__path__ = [os.path.join(os.path.dirname(spec.origin), "grpc_gen")]
        sys.modules[_PKG] = pkg
    return importlib.import_module(f"{_PKG}.{name}")


common_pb2 = _load("common_pb2")
schema_pb2 = _load("schema_pb2")
msg_pb2 = _load("msg_pb2")

__all__ = ["common_pb2", "msg_pb2", "schema_pb2"]
