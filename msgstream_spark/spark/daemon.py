"""Spark's Python worker daemon with msgstream's modules imported once, before it forks: an opt-in for a session,

    SparkSession.builder.config("spark.python.daemon.module", "msgstream_spark.spark.daemon")

(``--conf spark.python.daemon.module=msgstream_spark.spark.daemon`` with spark-submit; the executors' Python must
have msgstream-spark installed, as it must to read or write with it at all).

Spark runs one daemon per executor (``python -m <daemon module> pyspark.worker``) and forks a Python worker from it
for each task slot; pyspark's daemon imports nothing heavy before the fork, so each new worker imports pyspark's
worker, pyarrow, pandas and msgstream's reader and writer itself: ~0.55 s of CPU before its first task (measured on
the development machine, the compiled modules cached). Spark forks a new worker whenever it drops one: a query that
stops reading early (``first()``, ``limit``), a failed or killed task, a worker idle for a minute (Spark's idle
timeout). This daemon imports those modules once, before serving, so a forked worker starts with them loaded.

pyspark's daemon imports after the fork on purpose: a fork copies only the forking thread, and pyarrow and numpy
start threads when imported. Here they start none: Spark runs the daemon with ``OMP_NUM_THREADS`` set to the task's
cores (1: OpenBLAS starts no pool), and pyarrow's jemalloc is loaded without its background purging thread (its
``JE_ARROW_MALLOC_CONF``, unless already set; pyarrow allocates from mimalloc by default). The daemon counts its
threads after the imports: if another library started one, it logs that and runs pyspark's own daemon instead
(``exec``: nothing imported here is kept). A forked worker reseeds numpy's global random generator, as a worker that
imported numpy itself would have its own seed.
"""

from __future__ import annotations

import gc
import importlib
import os
import sys
import threading
import zipimport

# What a worker serving msgstream's reads and writes imports after the fork (measured: the new modules of a fresh
# worker after its first task), in the order they are imported; a name this pyspark lacks is skipped.
PRELOAD = (
    "pyspark.sql.worker.plan_data_source_read",  # the read function a data source's partitions run in
    "pyspark.sql.worker.write_into_data_source",  # the write function
    "pandas",
    "pyarrow.compute",
    "pyarrow.ipc",
    "pyarrow.pandas_compat",
    "msgstream_spark.spark.datasource",  # the reader, the stream reader, the writer, the codec
    "msgstream_spark.mq.local.client",  # the backends' clients, when their libraries are installed (none starts a
    "msgstream_spark.mq.kafka.client",  # thread when imported; the milvus backend's gRPC is left to the workers)
    "msgstream_spark.mq.pulsar.client",
    "pyarrow.parquet",  # the mirror's tasks: its data files and its writer
    "pyarrow.dataset",
    "msgstream_spark.spark.mirror",
)
NO_JEMALLOC_THREAD = ("JE_ARROW_MALLOC_CONF", "background_thread:false")


def threads() -> int:
    """The process's threads (native ones too: /proc on Linux; Python's own count elsewhere)."""
    try:
        return len(os.listdir("/proc/self/task"))
    except OSError:
        return threading.active_count()


def preload(worker_module: str | None) -> list[str]:
    """Import the worker module and :data:`PRELOAD`; the names imported (those this environment lacks skipped)."""
    var, value = NO_JEMALLOC_THREAD
    set_here = var not in os.environ
    if set_here:
        os.environ[var] = value  # read once, when pyarrow's library loads
    done = []
    try:
        for name in ([worker_module] if worker_module else []) + list(PRELOAD):
            try:
                importlib.import_module(name)
            except ImportError:
                continue  # e.g. another pyspark's module names: that worker imports what it needs itself
            done.append(name)
    finally:
        if set_here:
            del os.environ[var]  # the workers' environment stays Spark's
    return done


def forget_zip_finders() -> None:
    """Drop the zip importers from Python's finder cache (they are made again, cheaply, when next needed).

    A worker's first task adds Spark's files directory to ``sys.path`` and calls ``importlib.invalidate_caches()``,
    which makes every cached zip importer read its archive's directory again: one per package imported from
    ``pyspark.zip`` (~20 after the preloading), ~0.13 s of CPU in each forked worker; with none cached, ~0."""
    for path, finder in list(sys.path_importer_cache.items()):
        if isinstance(finder, zipimport.zipimporter):
            del sys.path_importer_cache[path]


def _reseed_numpy() -> None:
    np = sys.modules.get("numpy")
    if np is not None:
        np.random.seed()  # from the OS's entropy, as a fresh import would


def main() -> None:
    worker_module = sys.argv[1] if len(sys.argv) > 1 and sys.argv[1].startswith("pyspark") else "pyspark.worker"
    preload(worker_module)
    n = threads()
    if n > 1:
        print(f"msgstream_spark.spark.daemon: {n} threads after importing msgstream's modules; a fork would copy "
              "only one: running pyspark.daemon instead", file=sys.stderr, flush=True)
        os.execv(sys.executable, [sys.executable, "-m", "pyspark.daemon", *sys.argv[1:]])
    from pyspark import daemon

    forget_zip_finders()
    os.register_at_fork(after_in_child=_reseed_numpy)
    gc.freeze()  # the preloaded objects: a worker's collections neither scan nor touch (copy) their pages
    daemon.manager()


if __name__ == "__main__":
    main()
