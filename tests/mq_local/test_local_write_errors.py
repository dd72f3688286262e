"""Regressions found by the chaos suite (issue 12): write failures of the embedded log are
ProduceErrors naming the file and the channel, and keep nothing of the failed batch."""

from __future__ import annotations

import subprocess
import sys

import pytest

from msgstream_spark.config import Config
from msgstream_spark.errors import ProduceError
from msgstream_spark.mq.base import ProducerMessage
from msgstream_spark.mq.local.client import LocalClient

FULL = """
import resource, signal, sys
from msgstream_spark.config import Config
from msgstream_spark.errors import ProduceError
from msgstream_spark.mq.base import ProducerMessage
from msgstream_spark.mq.local.client import LocalClient
p = LocalClient(Config.from_dict({"local": {"path": sys.argv[1], "mmapSizeMB": 0}})).create_producer("c")
p.send(ProducerMessage(b"first"))
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (1 << 20, 1 << 20))
try:
    p.send_batch([ProducerMessage(b"." * 4096) for _ in range(1000)])
except ProduceError as exc:
    print(exc)
"""


def test_a_full_disk_is_a_produce_error_naming_file_and_channel(tmp_path):
    db = tmp_path / "log.db"
    r = subprocess.run([sys.executable, "-c", FULL, str(db)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr[-2000:]
    assert str(db) in r.stdout and "channel c" in r.stdout and "full" in r.stdout, r.stdout
    with LocalClient(Config.from_dict({"local": {"path": str(db)}})) as c:
        rd = c.reader("c")
        rd.seek(c.earliest_message_id(), inclusive=True)
        assert [m.payload for m in rd.receive_batch(2000, 1.0)] == [b"first"]  # the failed batch left nothing


def test_the_write_lock_timeout_names_the_file(tmp_path):
    db = tmp_path / "log.db"
    cfg = Config.from_dict({"local": {"path": str(db), "busyTimeout": 0.2}})
    with LocalClient(cfg) as c, c.create_producer("c") as p:
        p.send(ProducerMessage(b"first"))
        holder = subprocess.Popen([sys.executable, "-c", "import sqlite3,sys; c=sqlite3.connect(sys.argv[1], "
                                   "isolation_level=None); c.execute('BEGIN EXCLUSIVE'); print('x', flush=True); "
                                   "sys.stdin.read()", str(db)], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        try:
            assert holder.stdout.readline().strip() == b"x"
            with pytest.raises(ProduceError, match="write lock") as ei:
                p.send(ProducerMessage(b"second"))
        finally:
            holder.stdin.close()
            holder.wait(30)
        assert str(db) in str(ei.value) and "channel c" in str(ei.value)
