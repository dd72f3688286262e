"""The one definition of a secret, and the maskers built on it: every printed config, log line, error, lease
record and refusal of the package hides secrets through these functions.

:func:`is_secret` judges a key name in any of the spellings the package meets: Milvus's config keys
(``kafka.saslPassword``, ``pulsar.authParams``, ``milvus.token``), librdkafka's and Pulsar's pass-through keys
(``sasl.password``, ``ssl.key.pem``), object_store's storage keys of every backend and their aliases
(``aws_secret_access_key``, ``session_token``, ``google_service_account_key``, ``azure_storage_account_key``,
``account_key``, ``azure_storage_sas_key``, ``client_secret``), pyiceberg's FileIO and catalog properties
(``s3.secret-access-key``, ``adls.account-key``, ``adls.connection-string``, ``adls.sas-token``,
``gcs.oauth2.token``, ``token``, ``credential``, ``header.Authorization``) and Hadoop's
(``fs.s3a.secret.key``). Key names are compared case-insensitively with ``-``, ``.`` and ``/`` read as ``_``.
It errs on the side of hiding: a key that merely names a token file (``aws_web_identity_token_file``) is masked.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any

MASK = "******"

# a key holding any of these (normalised: lower case, "-", ".", "/" and spaces as "_") is a secret
_PARTS = ("password", "passwd", "secret", "token", "credential", "authparams", "authentication", "authorization",
          "sasl_jaas", "connection_string", "private_key", "key_pem", "auth_user_info", "api_key", "apikey",
          "customer_key", "account_key", "_sas_")
# ... and a key ending in one of these (access_key, master_key, sas_key, service_account_key, encryption_key; a
# GCS service account's file too; not s3.access-key-id, primary_key or sse_kms_key_id)
_ENDS = ("access_key", "master_key", "sas_key", "service_account_key", "encryption_key",
         "signing_key", "secret_key", "service_account", "service_account_path")
# an HTTP authorization scheme: its credential follows after a space (header.Authorization=Bearer XYZ)
_SCHEMES = ("bearer", "basic", "digest", "token", "negotiate", "aws4-hmac-sha256", "sharedkey")
_USERINFO = re.compile(r"://([^:/@\s]+):([^@/\s]+)@")  # a password in a URL (postgresql://user:pw@host/db)
# KEY=VALUE, KEY: VALUE, "KEY": "VALUE" in a text; the value (looked ahead at, so that a key inside a value is
# seen too: --storage-option=account_key=...) one word, or an authorization scheme and its word
_ASSIGNMENT = re.compile(
    r"""(?P<key>[A-Za-z_][\w.\-/]*)(?P<sep>["']?\s*[=:]\s*["']?)"""
    r"""(?=(?P<value>(?:(?:Bearer|Basic|Digest|Token|Negotiate|SharedKey|AWS4-HMAC-SHA256)\s+)?[^\s,;&"'}\])]+))""",
    re.IGNORECASE)


def _norm(key: str) -> str:
    return re.sub(r"[-./\s]", "_", str(key).strip().lower()).lstrip("_")


def is_secret(key: str) -> bool:
    """Whether the value of setting ``key`` (any backend's, any spelling) is a secret."""
    k = _norm(key)
    return any(p in k for p in _PARTS) or k.endswith(_ENDS)


def mask_value(key: str, value: Any) -> Any:
    """``value``, or ``******`` if ``key`` is a secret and the value is not empty."""
    return MASK if is_secret(key) and value not in ("", None) else value


def mask_mapping(values: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of ``values`` with every secret's value replaced by ``******``."""
    return {k: mask_value(str(k), v) for k, v in values.items()}


def _text(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return "" if value is None else str(value)


def _mask_assignments(text: str) -> str:
    out: list[str] = []
    pos = 0
    for m in _ASSIGNMENT.finditer(text):
        if m.start() < pos or not is_secret(m.group("key")):
            continue  # inside a value already hidden, or no secret
        out += [text[pos:m.end()], MASK]
        pos = m.end() + len(m.group("value"))
    return "".join(out) + text[pos:]


def mask_text(text: str, options: Mapping[str, Any] | None = None) -> str:
    """``text`` (a log line, an error, a command line) with every secret hidden: passwords in URLs, the values
    of secret ``KEY=VALUE`` / ``KEY: VALUE`` / ``"KEY": "VALUE"`` assignments, and wherever they appear, the
    values of the secrets of ``options`` (4 characters or more: shorter ones would mask unrelated text)."""
    out = _mask_assignments(_USERINFO.sub(r"://\1:" + MASK + "@", str(text)))
    for k, v in (options or {}).items():
        secret = _text(v)
        if is_secret(str(k)) and len(secret) >= 4:
            out = out.replace(secret, MASK)
    return out


def _flag(arg: str) -> str | None:
    """The name of a ``--flag`` / ``-flag`` argument (without ``=value``), None if ``arg`` is no flag."""
    if len(arg) < 2 or not arg.startswith("-") or arg[1].isdigit() or arg[1] == " ":
        return None
    return arg.lstrip("-").split("=", 1)[0]


def _mask_arg(arg: str) -> tuple[str, bool]:
    """One argument masked, and whether the next argument is a secret too."""
    flag = _flag(arg)
    name, eq, rest = arg.partition("=")
    if flag is not None:
        if is_secret(flag):
            return (f"{name}={MASK}", False) if eq else (arg, True)
        if not eq:
            return arg, False
        inner, hide_next = _mask_arg(rest)  # --storage-option=account_key=...
        return f"{name}={inner}", hide_next
    if eq and is_secret(name):
        return f"{name}={MASK}", rest.strip().lower() in _SCHEMES  # header.Authorization=Bearer, then XYZ
    return arg, False


def mask_command(argv: Iterable[str], options: Mapping[str, Any] | None = None) -> str:
    """A command line (``sys.argv``) as one text with every secret hidden: the value of a secret
    ``KEY=VALUE`` argument (``--storage-option azure_storage_account_key=...``, ``--catalog-option
    header.Authorization=Bearer ...``: the whole argument, spaces included, and the next one too if the value is
    only an authorization scheme), the value of a secret flag (``--password X``, ``--token=X``), then
    :func:`mask_text` (URLs, assignments inside an argument, the values of ``options``' secrets)."""
    out: list[str] = []
    hide_next = False
    for arg in (str(a) for a in argv):
        if hide_next:
            out.append(MASK)
            hide_next = False
            continue
        shown, hide_next = _mask_arg(arg)
        out.append(shown)
    return mask_text(" ".join(out), options)
