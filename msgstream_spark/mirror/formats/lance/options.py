"""What Lance is handed of the table's store: the dataset URI and its storage options, from the same settings
the store resolved (object_store keys: Lance's object store is object_store too)."""

from __future__ import annotations

from collections.abc import Mapping

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.store import Store, uri


def lance():
    """The ``lance`` module (``pylance``); MirrorError naming the extra to install if it is missing."""
    try:
        import lance as mod
    except ImportError as e:
        raise MirrorError("the lance table format needs the 'pylance' package: pip install "
                          "'msgstream-spark[mirror]'") from e
    return mod


def dataset_uri(location: str) -> str:
    """The location as Lance opens it: a local path as an absolute path, an object store's URI as it is."""
    loc = uri.parse(location)
    return loc.key if loc.kind == "local" else loc.uri()


def storage_options(store: Store) -> dict[str, str]:
    """The store's settings as Lance's storage options (object_store keys; ``allow_http`` spelled both ways,
    which object_store's S3 and client configurations each read)."""
    out = dict(store.options)
    return _with_http(out)


def _with_http(opts: Mapping[str, str]) -> dict[str, str]:
    out = dict(opts)
    for k in ("aws_allow_http", "google_allow_http", "azure_allow_http"):
        if k in out and "allow_http" not in out:
            out["allow_http"] = out[k]
    return out


def conflict_error() -> type[BaseException]:
    """What Lance raises when a commit conflicts with one that landed since its base."""
    lance()
    from lance.commit import CommitConflictError

    return CommitConflictError
