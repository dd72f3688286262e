"""A Spark Connect client program, as a user runs it: ``python client_app.py '<json spec>'``.

Run by tests/spark_connect in its own process from a temp directory (pyspark allows one kind of session per
process, and a Connect session switches the whole process into Connect mode). Prints one JSON line.
``python client_app.py -``: one spec per line of its input, each in a Connect session of its own (stopped after
it), one JSON line each (``{"error": ...}`` for a spec that failed): the module's calls that need no process of
their own share one (its start, ~1 s of CPU, once).

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


def main(spec: dict) -> dict:
    from pyspark.sql import SparkSession

    spark = SparkSession.builder.remote(spec["url"]).getOrCreate()
    if spec.get("register"):
        from msgstream_spark.spark.datasource import MsgStreamDataSource

        class ClientSideAlias(MsgStreamDataSource):
            """Defined here, so format("msgstream_client") can only resolve through the client's registration."""

            @classmethod
            def name(cls) -> str:
                return "msgstream_client"

        spark.dataSource.register(MsgStreamDataSource)
        spark.dataSource.register(ClientSideAlias)
    try:
        actions = {"read": read, "stream": stream, "write": write, "stream_write": stream_write}
        return actions[spec["action"]](spark, spec)
    finally:
        spark.stop()


def serve() -> None:
    """Specs from stdin, one per line, until it closes; a failed spec's traceback as its answer."""
    import traceback

    for line in sys.stdin:
        try:
            answer = main(json.loads(line))
        except Exception:  # noqa: BLE001 - the test shows it and fails
            answer = {"error": traceback.format_exc()}
        print(json.dumps(answer), flush=True)


if __name__ == "__main__":
    if sys.argv[1] == "-":
        serve()
    else:
        print(json.dumps(main(json.loads(sys.argv[1]))))
