"""What every subcommand shares: usage errors, the config, the client, channel lists, progress."""

from __future__ import annotations

import sys
import time

from msgstream_spark.cli.vocab import UsageError, config_only, config_overrides, split_channels
from msgstream_spark.config import Config
from msgstream_spark.mq.base import Client
from msgstream_spark.mq.registry import build_client

__all__ = ["UsageError", "load_config", "open_client", "progress_line", "split_channels", "write_progress"]


def load_config(args) -> Config:
    """``--config`` with the config keys of ``--option`` (a command whose ``--option`` takes config keys only
    refuses any other key, naming it)."""
    if getattr(args, "option_kind", "config") == "config":
        words = (getattr(args, "command", None), getattr(args, "mirror_command", None))
        config_only(args, " ".join(w for w in words if w))
    return Config.load(args.config, overrides=config_overrides(args) or None)


def open_client(args) -> Client:
    cfg = load_config(args)
    return build_client(cfg.mq_type, cfg)


def progress_line(done: int, total: int | None, t0: float) -> str:
    rate = done / max(time.perf_counter() - t0, 1e-9)
    if total:
        frac = min(1.0, done / total)
        bar = "#" * int(frac * 30)
        return f"\r[{bar:<30}] {frac * 100:5.1f}% {done}/{total} rows {rate:,.0f} rows/s"
    return f"\r{done} rows {rate:,.0f} rows/s"


def write_progress(text: str, final: bool = False) -> None:
    if sys.stderr.isatty():
        sys.stderr.write(text + ("\n" if final else ""))
        sys.stderr.flush()
    elif final:
        sys.stderr.write(text.lstrip("\r") + "\n")
