"""Freshness of a mirrored table (issue #29 part 2), on the embedded log with the independent 2.6 producer.

Every mirror commit records its watermark (the batch's end offset: per channel the last message id and its
Milvus time); ``msgstream mirror status`` compares it with the log: freshness on Milvus's clock, the
backlog after the watermark, and ``stalled`` when the log has data the table's last commit does not.
"""

from __future__ import annotations

import json

import pytest

from tests.jobs.test_mirror_job import run_mirror
from tests.sink.helpers import config_file
from tests.spark import wal26_data as D
from tests.wal26 import producer as P

pytestmark = pytest.mark.slow

SECOND = 1000 << 18  # one second of Milvus's hybrid clock


def status(capsys, cfg: str, table, *extra: str) -> dict:
    from msgstream_spark.cli.main import main

    capsys.readouterr()
    assert main(["mirror", "status", "--config", cfg, "--table", str(table), *extra]) == 0
    return json.loads(capsys.readouterr().out)


def test_commits_record_the_watermark_and_status_shows_freshness_backlog_stalled(spark, local_env, tmp_path,
                                                                                   capsys):
    import deltalake

    ch, tt, table = local_env.new_channel("fresh"), D.TT, tmp_path / "t"
    cfg = config_file(local_env, tmp_path)
    with local_env.client() as c, c.create_producer(ch) as prod:
        P.write(prod, [P.create_collection(tt), P.insert(tt + 1, [1, 2]), P.timetick(tt + 2)])
        first = run_mirror(spark, cfg, ch, table)
        assert first["freshness_ms"] is not None
        info = deltalake.DeltaTable(str(table)).history(1)[0]
        recorded = json.loads(info["msgstream.watermark"])
        assert list(recorded) == [ch] and recorded[ch]["ts"] == tt + 2  # the batch's end: the tick

        s = status(capsys, cfg, table)
        assert s["watermark_source"] == "commit" and s["collection"] == "c26"
        one = s["channels"][ch]
        assert (one["backlog_messages"], one["backlog_rows"], one["freshness_ms"]) == (0, 0, 0)
        assert one["watermark_ts"] == tt + 2 and not s["stalled"]

        P.write(prod, [P.insert(tt + 3 * SECOND, [3, 4, 5]), P.delete(tt + 4 * SECOND, [1]),
                       P.timetick(tt + 5 * SECOND)])
        s = status(capsys, cfg, table, "--stalled-after", "0")
        one = s["channels"][ch]
        assert (one["backlog_messages"], one["backlog_rows"]) == (2, 4)
        assert one["log_ts"] == tt + 5 * SECOND and one["freshness_ms"] == 5000
        assert one["stalled"] and s["stalled"] and s["backlog_rows"] == 4
        assert not status(capsys, cfg, table)["stalled"]  # the last commit is younger than 60 s

        run_mirror(spark, cfg, ch, table)
        s = status(capsys, cfg, table, "--stalled-after", "0")
        one = s["channels"][ch]
        assert (one["backlog_messages"], one["freshness_ms"], one["watermark_ts"]) == (0, 0, tt + 5 * SECOND)
        assert not s["stalled"]
