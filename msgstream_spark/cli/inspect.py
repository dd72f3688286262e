"""``msgstream inspect``: decode one raw payload, with the properties it was sent with.

The properties decide the format, as on a channel: ``msg_type`` (2.5) or the 2.6 WAL keys
(``_v``, ``_t``, ``_tt``, ``_vc``, ``_h``, ...), given as ``--property k=v`` (repeatable) and/or
``--properties '<json map>'``. A 2.6 message is shown with its envelope (version, type, time tick,
vchannel, transaction, broadcast). A corrupt or encrypted message is one error line, exit 1.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

from msgstream_spark.cli.render import dumps, message_dict
from msgstream_spark.errors import ConfigError
from msgstream_spark.msg.wal26 import decode_message


def _payload(args) -> bytes:
    if args.file:
        p = Path(args.file)
        if not p.is_file():
            raise ConfigError(f"--file: not found: {args.file}")
        return p.read_bytes()
    try:
        return base64.b64decode(args.base64.strip(), validate=True)
    except ValueError as exc:
        raise ConfigError(f"--base64: not valid base64: {exc}") from exc


def parse_properties(pairs: list[str] | None, as_json: str | None, msg_type: str | None) -> dict[str, str]:
    """``--properties`` (a JSON object of strings), then each ``--property k=v``, then ``--msg-type``."""
    props: dict[str, str] = {}
    if as_json:
        try:
            data = json.loads(as_json)
        except json.JSONDecodeError as exc:
            raise ConfigError(f"--properties: not valid JSON: {exc}") from None
        if not isinstance(data, dict):
            raise ConfigError(f"--properties: expected a JSON object of strings, got {type(data).__name__}")
        for k, v in data.items():
            if not isinstance(v, str):
                raise ConfigError(f"--properties: the value of {k!r} must be a string (flags are \"\"), "
                                  f"got {type(v).__name__}")
            props[str(k)] = v
    for pair in pairs or ():
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise ConfigError(f"--property: expected KEY=VALUE (a flag is KEY=), got {pair!r}")
        props[key] = value
    if msg_type:
        props["msg_type"] = msg_type
    return props


def cmd_inspect(args) -> int:
    payload = _payload(args)
    props = parse_properties(getattr(args, "property", None), getattr(args, "properties", None), args.msg_type)
    msg = decode_message(payload, props)
    print(dumps(message_dict(msg, properties=props or None, rows=args.rows, full=not args.rows)))
    return 0
