"""Implementations of the ``msgstream`` subcommands (argparse namespace in, exit code out)."""

from __future__ import annotations

import contextlib
import time
from typing import Any

from msgstream_spark.cli.common import UsageError, open_client, split_channels
from msgstream_spark.cli.inspect import cmd_inspect
from msgstream_spark.cli.job_commands import cmd_job_path
from msgstream_spark.cli.mirror_cmds import cmd_mirror
from msgstream_spark.cli.publish import publish
from msgstream_spark.cli.render import dumps, message_dict, position_dict
from msgstream_spark.cli.rows import cmd_rows
from msgstream_spark.cli.vocab import at_file
from msgstream_spark.errors import BackendTimeoutError, ChannelNotFoundError, ConfigError, DecodeError
from msgstream_spark.msg import codec, tso
from msgstream_spark.msg.position import MsgPosition, parse_positions
from msgstream_spark.msg.types import MsgType
from msgstream_spark.stream.decode import ChannelDecoder, rebuild_from_last_confirmed, wal_name
from msgstream_spark.stream.names import to_physical_channel
from msgstream_spark.stream.timeseek import first_at_or_after, message_time
from msgstream_spark.stream.walstart import parse_start

__all__ = ["COMMANDS", "UsageError", "latest_position", "run"]


def run(args) -> int:
    return COMMANDS[args.command](args)


# -- helpers -----------------------------------------------------------------------------------
@contextlib.contextmanager
def throwaway(consumer):
    """A consumer whose subscription is removed afterwards (the CLI never resumes one)."""
    try:
        yield consumer
    finally:
        consumer.unsubscribe()


def message_ts(msg, channel: str) -> int:
    """Milvus hybrid timestamp of a raw message, from the message itself (never the broker's clock)."""
    t = message_time(msg.payload, msg.properties)
    if t is not None:
        return t
    return int(codec.unmarshal(msg.payload, msg.properties, channel=channel,
                               msg_id=msg.id.serialize()).timestamp)


def _check_channels(client, chans: list[str]) -> None:
    missing = [c for c in chans if not client.channel_exists(c)]
    if missing:
        raise ChannelNotFoundError(f"channel(s) not found: {', '.join(missing)}")


def latest_position(client, channel: str, timeout: float = 10.0):
    """MsgPosition of the last message of ``channel`` (its own timestamp), or None if empty."""

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
    if getattr(args, "collection", None):  # milvus: the collections' pchannels and vchannels
        args.option = [*(args.option or []), f"milvus.collections={','.join(args.collection)}"]
    with open_client(args) as client:
        if getattr(args, "collection", None):
            if not hasattr(client, "collections"):
                raise UsageError(f"--collection needs mq.type=milvus (this config uses {client.name})")
            for coll in client.collections():
                print(dumps(coll.to_dict()))
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
                raise BackendTimeoutError(f"counting messages of channel {channel} took longer than {timeout}s "
                                "(use --timeout or --no-count)")
            batch = cons.receive_batch(4096, min(remaining, 5.0))
            n += len(batch)
            if batch and batch[-1].id >= last:
                return n
            if not batch and cons.latest_message_id() is None:
                return n


# -- position ----------------------------------------------------------------------------------
def cmd_position(args) -> int:
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
_WAL_STARTS = {"checkpoint": "checkpoint", "message-id": "message_id"}


def _tail_positions(start: str, chans: list[str]) -> dict:
    """{pchannel: MsgPosition} named by ``--from`` (empty for earliest/latest)."""
    if start.lower() in ("earliest", "latest"):
        return {}
    kind, sep, text = start.partition(":")
    if sep and kind in _WAL_STARTS:  # a Milvus 2.6 resume point names no channel: one --channels only
        if len(chans) != 1:
            raise UsageError(f"--from {kind}:... is the resume point of one pchannel: give one channel in --channels")
        return {chans[0]: parse_start(chans[0], text, _WAL_STARTS[kind])}
    try:
        parsed = parse_positions(start)
    except (DecodeError, ValueError) as exc:
        raise ConfigError(f"--from: not a position (JSON or base64 MsgPosition): {exc}") from exc
    positions = {to_physical_channel(p.channel_name): p for p in parsed}
    unknown = sorted(set(positions) - set(chans))
    if unknown:
        raise UsageError(f"--from names channel(s) not in --channels: {', '.join(unknown)}")
    return positions


def _open_tail_reader(client, ch: str, start: str, positions: dict, from_ts: int | None):
    """A reader of ``ch`` positioned for ``--from`` / ``--from-timestamp``: (reader, the channel decoder
    with the seek filter it needs, True when it starts past the channel's end)."""
    cons = client.reader(ch)  # the CLI never resumes: nothing is recorded on the broker
    start_ts, past = None, False
    if from_ts is not None:
        mid = first_at_or_after(client, ch, from_ts)  # by the messages' own times
        if mid is not None:
            cons.seek(mid, inclusive=True)
        else:
            _seek_past_end(client, cons, ch)
            past = True
    elif start.lower() == "latest":
        _seek_past_end(client, cons, ch)
        past = True
    elif ch in positions:  # Milvus's seek: at the msgID, then the shared seek filter (2.6: by _tt)
        p = positions[ch]
        cons.seek(client.bytes_to_message_id(p.msg_id), inclusive=True)
        start_ts = p.timestamp
    else:
        cons.seek(client.earliest_message_id(), inclusive=True)
    return cons, _tail_decoder(client, ch, start_ts), past


def _tail_decoder(client, ch: str, start_ts: int | None) -> ChannelDecoder:
    """Both formats; 2.6 transactions shown as Milvus applies them, with their Begin and Commit/Rollback."""
    try:
        wal = wal_name(client.name)
    except ConfigError:
        wal = wal_name(None)
    return ChannelDecoder(ch, wal, start_ts=start_ts, emit_control=True, id_of=client.bytes_to_message_id)


def _seek_past_end(client, cons, ch: str) -> None:
    """Position ``cons`` after the last message of ``ch``: everything that arrives from now on."""
    last = client.latest_message_id(ch)
    if last is not None:
        cons.seek(last, inclusive=False)
    else:  # empty channel
        cons.seek(client.earliest_message_id(), inclusive=True)


def _from_timestamp(args) -> int | None:
    """``tail --from-timestamp`` as a hybrid ts (None when not given)."""
    raw = getattr(args, "from_timestamp", None)
    if raw is None:
        return None
    try:
        return int(tso.parse_timestamp(raw))
    except (ValueError, TypeError) as exc:
        raise ConfigError(f"--from-timestamp: cannot parse timestamp {raw!r}: {exc}") from exc


def cmd_tail(args) -> int:
    chans = split_channels(args.channels)
    if args.limit is not None and args.limit <= 0:
        raise UsageError("--limit must be > 0")
    start = (at_file(args.start) or "earliest").strip()
    positions = _tail_positions(start, chans)
    from_ts = _from_timestamp(args)
    with open_client(args) as client:
        _check_channels(client, chans)
        readers = []
        try:
            for ch in chans:
                readers.append(_open_tail_reader(client, ch, start, positions, from_ts))
            # Without --follow, a channel is done at the last message it had when tail started:
            # a live Milvus writes a time tick every 200 ms, so "nothing arrives" never happens there.
            ends = {} if args.follow else {c.channel: None if past else client.latest_message_id(c.channel)
                                           for c, _, past in readers}
            return _tail_loop(args, client, [(c, s) for c, s, _ in readers], ends)
        finally:
            for cons, _, _ in readers:
                cons.unsubscribe()


def _tail_feed(client, decoders: dict, m) -> list:
    """Decode one message of its channel (a DecodeError ends tail with one error line)."""
    dec = decoders[m.channel]
    out = dec.feed(m)
    if dec.rewind_to is not None:  # started inside an open 2.6 transaction: rebuild it from its _lc
        decoders[m.channel], out = rebuild_from_last_confirmed(client, dec, m)
    return out


def _reached(channel: str, ends: dict) -> bool:
    """True once ``channel`` showed its last message as of the start (or was empty then)."""
    return channel in ends and ends[channel] is None


def _tail_loop(args, client, readers: list, ends: dict) -> int:
    printed = 0
    idle_since = time.monotonic()
    decoders = {cons.channel: dec for cons, dec in readers}
    while True:
        got_any = False
        for cons, _ in readers:
            if _reached(cons.channel, ends):
                continue
            for m in cons.receive_batch(256, 0.05):
                got_any = True
                if ends.get(m.channel) is not None and m.id >= ends[m.channel]:
                    ends[m.channel] = None  # this is its last message to show
                for d in _tail_feed(client, decoders, m):
                    if args.no_ticks and d.msg.msg_type == MsgType.TimeTick:
                        continue
                    print(dumps(message_dict(d.msg, channel=m.channel, msg_id=d.raw.id.serialize(),
                                             properties=dict(d.raw.properties), rows=args.rows)), flush=True)
                    printed += 1
                    if args.limit is not None and printed >= args.limit:
                        return 0
                if _reached(m.channel, ends):
                    break
        if ends and all(_reached(c.channel, ends) for c, _ in readers):
            return 0
        if got_any:
            idle_since = time.monotonic()
        elif not args.follow and time.monotonic() - idle_since >= args.timeout:
            return 0


# -- publish -----------------------------------------------------------------------------------
def cmd_publish(args) -> int:
    summary = publish(args)
    print(dumps(summary))
    return 0


COMMANDS = {
    "channels": cmd_channels,
    "position": cmd_position,
    "tail": cmd_tail,
    "rows": cmd_rows,
    "inspect": cmd_inspect,
    "publish": cmd_publish,
    "mirror": cmd_mirror,
    "job-path": cmd_job_path,
}
