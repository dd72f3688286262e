"""The many-collection job's database look-up of a collection id (``jobs/mirror_many_milvus.Locate``) against a Milvus
address where nothing listens: a collection's CreateCollection comes once per channel, and each ask of an
unreachable Milvus waits for its connect timeout, so an id Milvus did not answer for is asked once."""
from __future__ import annotations

import logging
import socket

from msgstream_spark.config.loader import Config
from msgstream_spark.jobs.mirror_many_milvus import Locate


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_unanswered_collection_id_is_asked_once(caplog):
    cfg = Config.from_dict({"milvus": {"address": f"127.0.0.1:{_closed_port()}", "requestTimeout": 1}})
    locate = Locate(cfg)
    with caplog.at_level(logging.WARNING, logger="msgstream_spark"):
        answers = [locate(41) for _ in range(4)]  # one CreateCollection copy on each of four channels
    assert answers == [None] * 4
    asked = [r for r in caplog.records if "did not answer" in r.getMessage()]
    assert len(asked) == 1, [r.getMessage() for r in asked]
    assert "collection id 41" in asked[0].getMessage()
