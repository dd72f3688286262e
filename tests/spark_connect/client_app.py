"""A Spark Connect client program, as a user runs it: ``python client_app.py '<json spec>'``.

Run by tests/spark_connect in its own process from a temp directory (pyspark allows one kind of session per
process, and a Connect session switches the whole process into Connect mode). Prints one JSON line.
``python client_app.py -``: one spec per line of its input, one JSON line each (``{"error": ...}`` for a spec that
failed): the module's calls that need no process of their own share one (its start, ~1 s of CPU, once), and those
that register nothing one Connect session (``serve``).

spec: url, action (read | stream | write | stream_write), options (Spark options), register (register the
data source from the client first), plus per action: read: formats; stream: checkpoint, out, subscription;
write: rows ([pk, [floats], name]); stream_write: checkpoint, subscription, sink_options.
"""

from __future__ import annotations

import json
import sys


def _rows(df) -> list:
    return sorted([r.op, r.pk, r.name] for r in df.select("op", "pk", "name").collect())


def read(spark, spec: dict) -> dict:
    """Rows read through each of ``formats`` (default: just "msgstream")."""
    formats = spec.get("formats", ["msgstream"])
    return {f: _rows(spark.read.format(f).options(**spec["options"]).load()) for f in formats}


def stream(spark, spec: dict) -> dict:
    df = spark.readStream.format("msgstream").options(**spec["options"]).option("subscription", spec["subscription"])
    q = (df.load().writeStream.format("parquet").option("path", spec["out"])
         .option("checkpointLocation", spec["checkpoint"]).trigger(availableNow=True).start())
    finished = q.awaitTermination(240)
    return {"finished": finished is not False, "rows": _rows(spark.read.parquet(spec["out"]))}


def stream_write(spark, spec: dict) -> dict:
    """msgstream channels -> msgstream channels, AvailableNow (deletes stay deletes: the reader's op column)."""
    df = spark.readStream.format("msgstream").options(**spec["options"]).option("subscription", spec["subscription"])
    q = (df.load().writeStream.format("msgstream").options(**spec["sink_options"])
         .option("checkpointLocation", spec["checkpoint"]).trigger(availableNow=True).start())
    return {"finished": q.awaitTermination(240) is not False}


def write(spark, spec: dict) -> dict:
    df = spark.createDataFrame([tuple(r) for r in spec["rows"]], "pk long, vec array<float>, name string")
    df.write.format("msgstream").options(**spec["options"]).mode("append").save()
    return {"written": len(spec["rows"])}


def register(spark) -> None:
    """The data source, and an alias of it only this session knows, registered from the client."""
    from msgstream_spark.spark.datasource import MsgStreamDataSource

    class ClientSideAlias(MsgStreamDataSource):
        """Defined here, so format("msgstream_client") can only resolve through the client's registration."""

        @classmethod
        def name(cls) -> str:
            return "msgstream_client"

    spark.dataSource.register(MsgStreamDataSource)
    spark.dataSource.register(ClientSideAlias)


def run(spark, spec: dict) -> dict:
    actions = {"read": read, "stream": stream, "write": write, "stream_write": stream_write}
    return actions[spec["action"]](spark, spec)


def main(spec: dict) -> dict:
    """``spec`` in a new Connect session (``create``: never another one of this process), stopped after it."""
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.remote(spec["url"]).create()
    try:
        if spec.get("register"):
            register(spark)
        return run(spark, spec)
    finally:
        spark.stop()


def serve() -> None:
    """Specs from stdin, one per line, until it closes; a failed spec's traceback as its answer. The specs that
    register nothing share one Connect session (the server starts Python planner daemons per session: ~2-3 s of
    CPU each new session, the forks they serve included); a spec that registers gets a session of its own, so a
    client-side registration is never seen by another spec."""
    import traceback

    from pyspark.sql import SparkSession

    shared = None
    try:
        for line in sys.stdin:
            try:
                spec = json.loads(line)
                if spec.get("register"):
                    answer = main(spec)
                else:
                    shared = shared or SparkSession.builder.remote(spec["url"]).create()
                    answer = run(shared, spec)
            except Exception:  # noqa: BLE001 - the test shows it and fails
                answer = {"error": traceback.format_exc()}
            print(json.dumps(answer), flush=True)
    finally:
        if shared is not None:
            shared.stop()


if __name__ == "__main__":
    if sys.argv[1] == "-":
        serve()
    else:
        print(json.dumps(main(json.loads(sys.argv[1]))))
