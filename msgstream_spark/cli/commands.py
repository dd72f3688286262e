"""Implementations of the ``msgstream`` subcommands (argparse namespace in, exit code out)."""

from __future__ import annotations

import base64
import contextlib
import sys
import time
from pathlib import Path
from typing import Any

from msgstream_spark.cli.render import dumps, message_dict, position_dict
from msgstream_spark.errors import ConfigError, DecodeError


class UsageError(Exception):
    """Bad combination of arguments (exit code 2)."""


def run(args) -> int:
    return COMMANDS[args.command](args)


# -- helpers -----------------------------------------------------------------------------------
def overrides(args) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in getattr(args, "set", []) or []:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--set expects KEY=VALUE, got {item!r}")
        out[key.strip()] = value
    return out


def load_config(args):
    from msgstream_spark.config import Config

    return Config.load(args.config, overrides=overrides(args) or None)


def open_client(args):
    from msgstream_spark.mq.registry import build_client

    cfg = load_config(args)
    return build_client(cfg.mq_type, cfg)


def split_channels(text: str | None) -> list[str]:
    chans = [c.strip() for c in (text or "").split(",") if c.strip()]
    if text is not None and not chans:
        raise UsageError("--channels is empty")
    return chans


@contextlib.contextmanager
def throwaway(consumer):
    """A consumer whose subscription is removed afterwards (the CLI never resumes one)."""
    try:
        yield consumer
    finally:
        consumer.unsubscribe()


def message_ts(msg, channel: str) -> int:
    """Milvus hybrid timestamp of a raw message, from the message itself (never the broker's clock)."""
    from msgstream_spark.stream.timeseek import message_time

    t = message_time(msg.payload, msg.properties)
    if t is not None:
        return t
    from msgstream_spark.msg import codec

    return int(codec.unmarshal(msg.payload, msg.properties, channel=channel,
                               msg_id=msg.id.serialize()).timestamp)


def _check_channels(client, chans: list[str]) -> None:
    from msgstream_spark.errors import ChannelNotFoundError

    missing = [c for c in chans if not client.channel_exists(c)]
    if missing:
        raise ChannelNotFoundError(f"channel(s) not found: {', '.join(missing)}")


def latest_position(client, channel: str, timeout: float = 10.0):
    """MsgPosition of the last message of ``channel`` (its own timestamp), or None if empty."""
    from msgstream_spark.msg.position import MsgPosition

    mid = client.latest_message_id(channel)
    if mid is None:
        return None
    with throwaway(client.reader(channel)) as cons:
        cons.seek(mid, inclusive=True)
        msg = cons.receive(timeout)
    ts = message_ts(msg, channel) if msg is not None else 0
    return MsgPosition(channel, mid.serialize(), "", ts)


# -- channels ----------------------------------------------------------------------------------
def cmd_channels(args) -> int:
    with open_client(args) as client:
        chans = split_channels(args.channels) if args.channels else sorted(client.list_channels())
        if args.channels:
            _check_channels(client, chans)
        for ch in chans:
            pos = latest_position(client, ch)
            row: dict[str, Any] = {"channel": ch, "latest": position_dict(pos) if pos else None}
            if not args.no_count:
                row["messages"] = count_messages(client, ch, args.timeout)
            print(dumps(row))
    return 0


def count_messages(client, channel: str, timeout: float) -> int:
    """Number of retained messages, counted by reading the channel up to its latest id."""
    from msgstream_spark.errors import TimeoutError as MsTimeout

    last = client.latest_message_id(channel)
    if last is None:
        return 0
    n = 0
    deadline = time.monotonic() + timeout
    with throwaway(client.reader(channel)) as cons:
        cons.seek(client.earliest_message_id(), inclusive=True)
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise MsTimeout(f"counting messages of channel {channel} took longer than {timeout}s "
                                "(use --timeout or --no-count)")
            batch = cons.receive_batch(4096, min(remaining, 5.0))
            n += len(batch)
            if batch and batch[-1].id >= last:
                return n
            if not batch and cons.latest_message_id() is None:
                return n


# -- position ----------------------------------------------------------------------------------
def cmd_position(args) -> int:
    from msgstream_spark.msg import tso
    from msgstream_spark.msg.position import MsgPosition
    from msgstream_spark.stream.timeseek import first_at_or_after

    chans = split_channels(args.channels)
    with open_client(args) as client:
        _check_channels(client, chans)
        at = None
        if args.at:
            try:
                at = int(tso.parse_timestamp(args.at))
            except (ValueError, TypeError) as exc:
                raise ConfigError(f"--at: cannot parse timestamp {args.at!r}: {exc}") from exc
        for ch in chans:
            if at is None:
                pos = latest_position(client, ch)
                if pos is None:
                    print(dumps({"channel_name": ch, "empty": True}))
                    continue
            else:
                mid = first_at_or_after(client, ch, at)  # by the messages' own times
                if mid is None:
                    print(dumps({"channel_name": ch, "empty": True, "timestamp": at}))
                    continue
                # Resuming from (msgID, ts) drops what is at or before ts: keep ts itself.
                pos = MsgPosition(ch, mid.serialize(), "", max(0, at - 1))
            print(dumps(position_dict(pos)))
    return 0


# -- tail --------------------------------------------------------------------------------------
def cmd_tail(args) -> int:
    from msgstream_spark.msg import codec

    chans = split_channels(args.channels)
    if args.limit is not None and args.limit <= 0:
        raise UsageError("--limit must be > 0")
    start = (args.start or "earliest").strip()
    positions = _tail_positions(start, chans)
    from_ts = _from_timestamp(args)
    printed = 0
    with open_client(args) as client:
        _check_channels(client, chans)
        consumers = []
        skip_upto = {}
        past_end = set()
        try:
            for ch in chans:
                cons = client.reader(ch)  # the CLI never resumes: nothing is recorded on the broker
                consumers.append(cons)
                skip, at_end = _tail_seek(client, cons, ch, start, positions.get(ch), from_ts)
                if skip is not None:
                    skip_upto[ch] = skip
                if at_end:
                    past_end.add(ch)
            # Without --follow, a channel is done at the last message it had when tail started:
            # a live Milvus writes a time tick every 200 ms, so "nothing arrives" never happens there.
            ends = {} if args.follow else {c.channel: None if c.channel in past_end else
                                           client.latest_message_id(c.channel) for c in consumers}
            idle_since = time.monotonic()
            while True:
                got_any = False
                for cons in consumers:
                    if not args.follow and _reached(cons.channel, ends):
                        continue
                    for m in cons.receive_batch(256, 0.05):
                        got_any = True
                        if not args.follow and _reached(m.channel, ends):
                            break
                        if not args.follow and ends.get(m.channel) is not None and m.id >= ends[m.channel]:
                            ends[m.channel] = None  # this is its last message to show
                        msg = codec.unmarshal(m.payload, m.properties, channel=m.channel, msg_id=m.id.serialize())
                        ts = int(msg.begin_ts)  # Milvus's seek rule; an upsert's insert has base ts 0
                        if cons.channel in skip_upto:
                            if ts <= skip_upto[cons.channel]:
                                continue
                            del skip_upto[cons.channel]
                        if args.no_ticks and _type_of(msg) == "TimeTick":
                            continue
                        print(dumps(message_dict(msg, channel=m.channel, msg_id=m.id.serialize(),
                                                 properties=dict(m.properties), rows=args.rows)), flush=True)
                        printed += 1
                        if args.limit is not None and printed >= args.limit:
                            return 0
                if not args.follow and all(_reached(c.channel, ends) for c in consumers):
                    return 0
                if got_any:
                    idle_since = time.monotonic()
                elif not args.follow and time.monotonic() - idle_since >= args.timeout:
                    return 0
        finally:
            for c in consumers:
                c.unsubscribe()


def _tail_positions(start: str, chans: list[str]) -> dict:
    """``tail --from POSITIONS`` per physical channel ({} for earliest/latest)."""
    from msgstream_spark.msg.position import parse_positions
    from msgstream_spark.stream.names import to_physical_channel

    if start.lower() in ("earliest", "latest"):
        return {}
    try:
        parsed = parse_positions(start)
    except (DecodeError, ValueError) as exc:
        raise ConfigError(f"--from: not a position (JSON or base64 MsgPosition): {exc}") from exc
    positions = {to_physical_channel(p.channel_name): p for p in parsed}
    unknown = sorted(set(positions) - set(chans))
    if unknown:
        raise UsageError(f"--from names channel(s) not in --channels: {', '.join(unknown)}")
    return positions


def _tail_seek(client, cons, ch: str, start: str, pos, from_ts: int | None) -> tuple[int | None, bool]:
    """Position one tail reader; returns (skip BeginTs <= this, True when it starts past the end)."""
    if from_ts is not None:
        return None, not _seek_time(client, cons, ch, from_ts)
    if start.lower() == "latest":
        last = client.latest_message_id(ch)
        if last is not None:
            cons.seek(last, inclusive=False)
        else:  # empty channel: everything that arrives from now on
            cons.seek(client.earliest_message_id(), inclusive=True)
        return None, True
    if pos is not None:
        cons.seek(client.bytes_to_message_id(pos.msg_id), inclusive=True)
        return pos.timestamp, False
    cons.seek(client.earliest_message_id(), inclusive=True)
    return None, False


def _reached(channel: str, ends: dict) -> bool:
    """True once ``channel`` showed its last message as of the start (or was empty then)."""
    return channel in ends and ends[channel] is None


def _from_timestamp(args) -> int | None:
    """``tail --from-timestamp`` as a hybrid ts (None when not given)."""
    raw = getattr(args, "from_timestamp", None)
    if raw is None:
        return None
    from msgstream_spark.msg import tso

    try:
        return int(tso.parse_timestamp(raw))
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"--from-timestamp: cannot parse timestamp {raw!r}: {exc}") from exc


def _seek_time(client, cons, channel: str, ts: int) -> bool:
    """Position ``cons`` at the first message whose own Milvus time is >= ``ts``; False when there
    is none yet (then past the end, for --follow)."""
    from msgstream_spark.stream.timeseek import first_at_or_after

    mid = first_at_or_after(client, channel, ts)
    if mid is not None:
        cons.seek(mid, inclusive=True)
        return True
    last = client.latest_message_id(channel)
    if last is not None:
        cons.seek(last, inclusive=False)
    else:
        cons.seek(client.earliest_message_id(), inclusive=True)
    return False


def _type_of(msg) -> str:
    from msgstream_spark.msg.pb import common_pb2

    try:
        return common_pb2.MsgType.Name(msg.proto.base.msg_type)
    except (AttributeError, ValueError):
        return "?"


# -- inspect -----------------------------------------------------------------------------------
def cmd_inspect(args) -> int:
    from msgstream_spark.msg import codec

    if args.file:
        p = Path(args.file)
        if not p.is_file():
            raise ConfigError(f"--file: not found: {args.file}")
        payload = p.read_bytes()
    else:
        try:
            payload = base64.b64decode(args.base64.strip(), validate=True)
        except ValueError as exc:
            raise ConfigError(f"--base64: not valid base64: {exc}") from exc
    props = {"msg_type": args.msg_type} if args.msg_type else {}
    msg = codec.unmarshal(payload, props)
    print(dumps(message_dict(msg, rows=args.rows, full=not args.rows)))
    return 0


# -- publish -----------------------------------------------------------------------------------
def cmd_publish(args) -> int:
    from msgstream_spark.cli.publish import publish

    summary = publish(args)
    print(dumps(summary))
    return 0


COMMANDS = {
    "channels": cmd_channels,
    "position": cmd_position,
    "tail": cmd_tail,
    "inspect": cmd_inspect,
    "publish": cmd_publish,
}


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
