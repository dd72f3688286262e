"""What every subcommand shares: usage errors, config overrides, the client, channel lists, progress."""

from __future__ import annotations

import sys
import time

from msgstream_spark.config import Config
from msgstream_spark.mq.base import Client
from msgstream_spark.mq.registry import build_client


class UsageError(Exception):
    """Bad combination of arguments (exit code 2)."""


def overrides(args) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in getattr(args, "set", []) or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--set expects KEY=VALUE, got {item!r}")
        out[key.strip()] = value
    return out


def load_config(args) -> Config:
    return Config.load(args.config, overrides=overrides(args) or None)


def open_client(args) -> Client:
    cfg = load_config(args)
    return build_client(cfg.mq_type, cfg)


def split_channels(text: str | None) -> list[str]:
    chans = [c.strip() for c in (text or "").split(",") if c.strip()]
    if text is not None and not chans:
        raise UsageError("--channels is empty")
    return chans


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
