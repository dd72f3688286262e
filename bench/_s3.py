"""An S3 server for bench/ scripts: the tests' moto server (tests/fixtures/s3_server.py, its requests handled one
at a time as in the suite), started from bench/moto_counted.py so that what every client fetched from it is
counted at the server (:meth:`BenchS3.counts`).

moto is a Python server on loopback: its own cost (one request at a time, each GET copying the whole object out
of its store, also for a ranged read) is in every figure taken against it, so a ratio against a local path says
what the mirror pays on *this* server, not on S3. It keeps objects over ~5 MiB in temporary files (its
``SpooledTemporaryFile`` buffer is 5 MiB), so a table of several GB costs its process little memory;
:meth:`BenchS3.rss_mb` tells how much.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from pathlib import Path

from tests.fixtures.s3_server import S3Server
from tests.fixtures.served import wait_ready


class BenchS3(S3Server):
    """``with BenchS3(log_dir) as s3:`` a started server; ``s3.uri(bucket, "t")``, ``s3.options()``."""

    def start(self) -> BenchS3:
        out = self.log.open("wb")
        script = Path(__file__).with_name("moto_counted.py")
        self.proc = subprocess.Popen([sys.executable, str(script), "127.0.0.1", str(self.port)], stdout=out,
                                     stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)
        out.close()
        wait_ready(self.proc, lambda: bool(urllib.request.urlopen(f"{self.endpoint}/moto-api/", timeout=2).read()),
                   what=f"moto_server on {self.endpoint}", timeout=self.start_timeout, log=self.log)
        return self

    def __enter__(self) -> BenchS3:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()

    def counts(self) -> dict[str, dict[str, int]]:
        """Requests and bytes in / out per HTTP method since the server started."""
        with urllib.request.urlopen(f"{self.endpoint}/_bench/counts", timeout=30) as r:
            return json.loads(r.read())

    def cpu_s(self) -> float:
        """The server process's CPU seconds so far (user + system, all its threads)."""
        fields = Path(f"/proc/{self.proc.pid}/stat").read_text().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")

    def rss_mb(self) -> float:
        """The server process's resident memory (MiB)."""
        for line in Path(f"/proc/{self.proc.pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
        return 0.0


def served(before: dict, after: dict) -> dict[str, int]:
    """What the server served between two :meth:`BenchS3.counts`: bytes fetched (GET response bodies), bytes
    put (PUT/POST bodies), GETs and all requests, and the GET bytes per kind of object (moto_counted.KINDS: the
    Delta log, its checkpoints, key indexes, deletion vectors, data files, ...)."""
    def d(method: str, k: str) -> int:
        return after.get(method, {}).get(k, 0) - before.get(method, {}).get(k, 0)

    methods = {m for m in set(before) | set(after) if not m.startswith("get:")}
    kinds = sorted(m for m in after if m.startswith("get:"))
    return {"get_bytes": d("GET", "out"), "gets": d("GET", "requests"),
            "put_bytes": d("PUT", "in") + d("POST", "in"),
            "requests": sum(d(m, "requests") for m in methods),
            "get_bytes_by_kind": {k[4:]: d(k, "out") for k in kinds if d(k, "requests")}}


def load_average() -> list[float]:
    """The machine's 1, 5 and 15 minute load averages (the figures are provisional on a shared machine)."""
    return [round(float(x), 2) for x in Path("/proc/loadavg").read_text().split()[:3]]
