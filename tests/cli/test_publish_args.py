"""``msgstream publish`` and the Spark job ``msgstream spark-publish`` take their shared arguments from one place."""

from __future__ import annotations

from msgstream_spark.cli.main import build_parser as cli_parser
from msgstream_spark.jobs.publish import build_parser as job_parser

SHARED = ["input", "synthetic", "format", "dim", "start", "delete_fraction", "collection", "collection_id",
          "partition", "primary_key", "field_types", "max_message_size", "wire_format", "transactional",
          "txn_keepalive"]


def test_cli_and_job_parse_the_same_publish_arguments():
    for argv in (["--input", "rows.jsonl", "--format", "jsonl", "--dim", "8"],
                 ["--synthetic", "10", "--max-message-size", "4096", "--delete-fraction", "0.5"],
                 ["--synthetic", "10", "--wire-format", "2.6", "--transactional", "--txn-keepalive", "500"]):
        cli = cli_parser().parse_args(["publish", "-c", "a", *argv])
        job = job_parser().parse_args(["--channels", "a", *argv])
        assert {k: getattr(cli, k) for k in SHARED} == {k: getattr(job, k) for k in SHARED}
    assert cli_parser().parse_args(["publish", "-c", "a", "--synthetic", "1"]).max_message_size is None
