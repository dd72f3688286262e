"""Milvus channel naming (wire doc §10.1): pchannels, vchannels and conversions."""

from __future__ import annotations

import re

_VCHANNEL_COLLECTION = re.compile(r".*_(\d+)v\d+$")


def vchannel_name(pchannel: str, collection_id: int, shard: int) -> str:
    """``<pchannel>_<collectionID>v<shard>``, e.g. ``by-dev-rootcoord-dml_3_449v0``."""
    return f"{pchannel}_{int(collection_id)}v{int(shard)}"


def to_physical_channel(name: str) -> str:
    """The pchannel of a vchannel; a physical name is returned unchanged.

    Milvus: if the text after the last ``_`` contains ``v``, drop that suffix.
    """
    head, sep, tail = name.rpartition("_")
    if sep and "v" in tail:
        return head
    return name


def collection_id_of(vchannel: str) -> int | None:
    """The collection id encoded in a vchannel name, or None for a pchannel."""
    m = _VCHANNEL_COLLECTION.match(vchannel)
    return int(m.group(1)) if m else None


def dml_channel_names(cluster: str = "by-dev", dml_prefix: str = "rootcoord-dml", count: int = 16) -> list[str]:
    """``<cluster>-<dml_prefix>_<i>`` for i in 0..count-1, as RootCoord names its pchannels."""
    name = f"{cluster}-{dml_prefix}"
    if "-partition-" in name:
        raise ValueError(f"channel prefix {name!r} must not contain '-partition-' (Pulsar client bug)")
    return [f"{name}_{i}" for i in range(count)]


def looks_like_milvus_dml(channel: str) -> bool:
    """True for names shaped like a live Milvus cluster's DML pchannels."""
    return re.fullmatch(r".+-rootcoord-dml_\d+", to_physical_channel(channel)) is not None
