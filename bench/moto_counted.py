"""The tests' moto S3 server (tests/fixtures/moto_serial.py: requests handled one at a time), counting what it
serves: ``python moto_counted.py HOST PORT``. ``GET /_bench/counts`` answers JSON of requests, bytes received
(request bodies) and bytes sent (response bodies) per HTTP method since the start: what every client of the
server moved, delta-rs's and pyiceberg's own reads included, not only the mirror's store. Run as a file, like
moto_serial.py (no package imports).
"""

from __future__ import annotations

import json
import sys
import threading
from pathlib import Path

COUNTS_PATH = "/_bench/counts"
# what an object is, by its key: the GET bytes are also counted per kind ("get:<kind>")
KINDS = (("_last_checkpoint", "delta_last_checkpoint"), (".checkpoint.parquet", "delta_checkpoint"),
         ("_delta_log/", "delta_log"), ("/_keys/", "key_index"), ("deletion_vector_", "deletion_vector"),
         ("/_changes/", "changes"), (".lease", "lease"), ("/metadata/", "iceberg_metadata"), (".parquet", "data"))


def kind(path: str) -> str:
    return next((k for frag, k in KINDS if frag in path), "other")


class Counted:
    def __init__(self, app) -> None:
        self.app = app
        self.lock = threading.Lock()
        self.counts: dict[str, dict[str, int]] = {}

    def __call__(self, environ, start_response):
        if environ.get("PATH_INFO") == COUNTS_PATH:
            with self.lock:
                body = json.dumps(self.counts).encode()
            start_response("200 OK", [("Content-Type", "application/json"), ("Content-Length", str(len(body)))])
            return [body]
        body = list(self.app(environ, start_response))
        sent = sum(len(b) for b in body)
        got = int(environ.get("CONTENT_LENGTH") or 0)
        with self.lock:
            c = self.counts.setdefault(environ.get("REQUEST_METHOD", "?"), {"requests": 0, "in": 0, "out": 0})
            c["requests"] += 1
            c["in"] += got
            c["out"] += sent
            if environ.get("REQUEST_METHOD") == "GET":
                name = f"get:{kind(environ.get('PATH_INFO', ''))}"
                k = self.counts.setdefault(name, {"requests": 0, "in": 0, "out": 0})
                k["requests"] += 1
                k["out"] += sent
        return body


def main(host: str, port: int) -> None:
    import os

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests" / "fixtures"))
    from moto.server import DomainDispatcherApplication, MotoRequestHandler, create_backend_app
    from moto_serial import Serialized
    from werkzeug.serving import run_simple

    os.environ.setdefault("MOTO_PORT", str(port))
    run_simple(host, port, Counted(Serialized(DomainDispatcherApplication(create_backend_app))), threaded=True,
               request_handler=MotoRequestHandler)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]))
