"""Locations as URIs: ``s3://bucket/key``, ``gs://``, ``az://container/key``, ``abfss://container@account...``,
``file:///abs/path`` or a plain local path. Parsing and joining only; no I/O."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from msgstream_spark.errors import ConfigError

# scheme -> the kind of store (the settings' family): s3a:// (Hadoop's name) is S3 too
KINDS = {"s3": "s3", "s3a": "s3", "gs": "gcs", "gcs": "gcs", "az": "azure", "azure": "azure", "abfs": "azure",
         "abfss": "azure", "adl": "azure", "file": "local", "": "local"}


@dataclass(frozen=True)
class Location:
    """A parsed location: ``kind`` (s3, gcs, azure, local), ``root`` (``scheme://bucket`` or ``""`` for a local
    path), ``key`` (the object key under the root, no leading slash; for a local path: the absolute path)."""

    kind: str
    scheme: str
    root: str
    key: str

    def uri(self, key: str | None = None) -> str:
        k = self.key if key is None else key
        if self.kind == "local":
            return k
        return f"{self.root}/{k}" if k else self.root


def parse(uri: str) -> Location:
    """Split ``uri``; ConfigError naming it if the scheme is not one the store knows. A URI or an absolute path
    is parsed once per process (a database job's batch parses ~50 a table: its files' locations); a relative
    path each time (it depends on the working directory)."""
    text = os.fspath(uri)
    if "://" not in text and not os.path.isabs(text):
        return Location("local", "", "", os.path.abspath(text))
    return _parse(text)


@functools.lru_cache(maxsize=8192)
def _parse(text: str) -> Location:
    if "://" not in text:
        return Location("local", "", "", os.path.abspath(text))
    parts = urlsplit(text)
    scheme = parts.scheme.lower()
    kind = KINDS.get(scheme)
    if kind is None:
        raise ConfigError(f"table location {text!r}: unknown scheme {scheme!r} (use s3://, gs://, az://, "
                          "abfss://, file:// or a local path)")
    if kind == "local":
        if parts.netloc not in ("", "localhost"):
            raise ConfigError(f"table location {text!r}: a file:// URI names no host (file:///absolute/path)")
        return Location("local", "", "", os.path.abspath(unquote(parts.path)))
    if not parts.netloc:
        raise ConfigError(f"table location {text!r} names no bucket or container ({scheme}://bucket/prefix)")
    return Location(kind, scheme, f"{scheme}://{parts.netloc}", parts.path.strip("/"))


def join(base: str, *parts: str) -> str:
    """``base`` with ``parts`` appended by ``/`` (a local base: by the OS's separator), in ``base``'s style."""
    loc = parse(base)
    clean = [p.strip("/") for p in parts if p and p.strip("/")]
    if loc.kind == "local":
        out = os.path.join(loc.key, *clean)
        return "file://" + out if os.fspath(base).startswith("file:") else out
    return loc.uri("/".join([loc.key, *clean]).strip("/"))


def relative(root: str, target: str) -> str | None:
    """``target``'s path under ``root`` (``/``-separated, as a Delta log names its files), None if it is not
    under it."""
    a, b = parse(root), parse(target)
    if a.kind != b.kind or a.root != b.root:
        return None
    base = a.key.rstrip("/")
    if a.kind == "local":
        if os.path.commonpath([base, b.key]) != base:
            return None
        return os.path.relpath(b.key, base).replace(os.sep, "/")
    if base and not b.key.startswith(base + "/"):
        return None
    return b.key[len(base) + 1:] if base else b.key


def relative_to(root: str) -> Callable[[str], str | None]:
    """:func:`relative` with ``root`` parsed once, for the many paths of a listing under it: a plain path under
    its prefix (a normalized local path; a URI with no query, fragment or slash at either end of what is cut:
    what a store's listing gives) is cut there, any other goes through :func:`relative`."""
    a = parse(root)
    base = a.key.rstrip("/")
    local = a.kind == "local"
    prefix = base.rstrip(os.sep) + os.sep if local else (f"{a.root}/{base}/" if base else f"{a.root}/")

    def rel(target: str) -> str | None:
        if target.startswith(prefix) and len(target) > len(prefix):
            cut = target[len(prefix):]
            if local and "://" not in target and os.path.normpath(target) == target:
                return cut.replace(os.sep, "/")
            if not local and cut[0] != "/" and cut[-1] != "/" and "?" not in cut and "#" not in cut:
                return cut
        return relative(root, target)

    return rel


def resolve(root: str, path: str) -> str:
    """A path a table's metadata names (relative to ``root``, or absolute: a URI or an absolute local path) as
    a full URI (a local path for a local root)."""
    if "://" in path:
        loc = parse(path)
        return loc.uri() if loc.kind != "local" else loc.key
    if os.path.isabs(path):
        return path
    return join(root, path)


def resolver(root: str) -> Callable[[str], str]:
    """:func:`resolve` with ``root`` parsed once, for the many paths of a table's metadata."""
    loc = parse(root)
    file_style = os.fspath(root).startswith("file:")

    def res(path: str) -> str:
        if "://" in path or os.path.isabs(path):
            return resolve(root, path)
        part = path.strip("/")
        if loc.kind == "local":
            out = os.path.join(loc.key, part) if part else loc.key
            return "file://" + out if file_style else out
        return loc.uri("/".join([loc.key, part] if part else [loc.key]).strip("/"))

    return res
