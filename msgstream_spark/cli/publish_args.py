"""The publish arguments, defined once for ``msgstream publish`` and ``msgstream spark-publish`` (the job)."""

from __future__ import annotations

import argparse

FORMATS = ["parquet", "csv", "json", "jsonl"]  # json and jsonl both mean JSON Lines


def add_publish_args(p: argparse.ArgumentParser) -> None:
    """Input (file or synthetic rows), collection facts and the split size; each tool adds its own."""
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--input", "-i", help="Parquet, CSV or JSON Lines file (the Spark job: also a directory)")
    src.add_argument("--synthetic", type=int, metavar="ROWS", help="generate ROWS rows (pk, category, score, vec)")
    p.add_argument("--format", choices=FORMATS, help="input format; json and jsonl are JSON Lines (default: from "
                                                     "the file suffix)")
    p.add_argument("--dim", type=int, default=128, help="vector dimension of --synthetic (default 128)")
    p.add_argument("--start", type=int, default=0, help="first primary key of --synthetic (default 0)")
    p.add_argument("--delete-fraction", type=float, default=0.0,
                   help="afterwards delete every (1/f)-th published primary key (0..1, default 0)")
    p.add_argument("--collection", default="msgstream", help="collection name (default msgstream)")
    p.add_argument("--collection-id", type=int, help="collection id (default: derived from the name)")
    p.add_argument("--partition", default="_default", help="partition name")
    p.add_argument("--primary-key", help="primary key column (default: pk or id)")
    p.add_argument("--field-types", help="Milvus types for ambiguous columns, e.g. emb:Float16Vector,tags:Array")
    p.add_argument("--max-message-size", type=int, default=None,
                   help="split size in bytes (default: the config's pulsar.maxMessageSize, 2 MiB)")
    p.add_argument("--wire-format", choices=["2.5", "2.6"], default="2.5",
                   help="message format: 2.5 (msgstream messages, default) or 2.6 (Milvus 2.6 streaming WAL)")
    p.add_argument("--transactional", action="store_true",
                   help="with --wire-format 2.6: each write task's messages per channel in one transaction")
    p.add_argument("--txn-keepalive", type=int, default=None, metavar="MS",
                   help="transaction keepalive in milliseconds (default 10000, Milvus's)")


def wire_options(args) -> dict[str, str]:
    """The sink options of --wire-format, --transactional and --txn-keepalive (defaults left out)."""
    opts = {}
    if args.wire_format != "2.5":
        opts["wireFormat"] = args.wire_format
    if args.transactional:
        opts["transactional"] = "true"
    if args.txn_keepalive is not None:
        opts["txnKeepalive"] = str(args.txn_keepalive)
    return opts
