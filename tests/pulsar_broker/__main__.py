"""Run the test broker in its own process: ``python -m tests.pulsar_broker [--port N] [--web-port N]``.

Prints ``READY <port> <web port>`` once listening and serves until stdin closes (or SIGTERM),
so a parent (e.g. a benchmark) does not share its interpreter lock with the broker.
"""

from __future__ import annotations

import argparse
import sys

from tests.pulsar_broker.server import PulsarTestBroker


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--web-port", type=int, default=0)
    args = ap.parse_args()
    with PulsarTestBroker().start(args.port, args.web_port) as broker:
        print(f"READY {broker.port} {broker.web_port}", flush=True)
        sys.stdin.read()  # returns when the parent closes our stdin or exits


if __name__ == "__main__":
    main()
