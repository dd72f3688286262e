"""Delta deletion vectors, written and read by this project (delta-rs writes none: delta-rs issue 4512).

Delta's protocol (PROTOCOL.md, "Deletion Vector Format"): a deletion vector is a 64-bit roaring bitmap of
the deleted row positions of one data file, serialized as the magic number 1681511377 (int32
little-endian), the number of 32-bit bitmaps (int64 LE), then per bitmap its high 32 bits (uint32 LE) and
the bitmap in the portable roaring format (pyroaring's ``serialize``). A DV file starts with a version byte
(1); each vector in it is its size (int32 big-endian: magic + bitmap), the bytes, and their CRC-32 (int32 BE).
The ``add`` action's ``deletionVector`` descriptor names it: storage type ``u`` (a file in the table's
directory named ``deletion_vector_<uuid>.bin``, the uuid Z85-encoded in ``pathOrInlineDv``), the offset of
the size field, ``sizeInBytes`` and ``cardinality``.
"""

from __future__ import annotations

import struct
import uuid
import zlib

import numpy as np

from msgstream_spark.errors import MirrorError
from msgstream_spark.mirror.store import NotFound, Store, uri

MAGIC = 1681511377
_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_INDEX = {c: i for i, c in enumerate(_Z85)}


def _roaring():
    try:
        import pyroaring
    except ImportError as e:
        raise MirrorError("Delta deletion vectors need the 'pyroaring' package: pip install "
                          "'msgstream-spark[mirror]'") from e
    return pyroaring


def z85_encode(data: bytes) -> str:
    if len(data) % 4:
        raise MirrorError(f"Z85 encodes multiples of 4 bytes, got {len(data)}")
    out = []
    for (word,) in struct.iter_unpack(">I", data):
        chars = []
        for _ in range(5):
            word, r = divmod(word, 85)
            chars.append(_Z85[r])
        out.append("".join(reversed(chars)))
    return "".join(out)


def z85_decode(text: str) -> bytes:
    if len(text) % 5:
        raise MirrorError(f"a Z85 string has a multiple of 5 characters, got {text!r}")
    out = bytearray()
    for i in range(0, len(text), 5):
        word = 0
        for c in text[i:i + 5]:
            word = word * 85 + _Z85_INDEX[c]
        out += struct.pack(">I", word)
    return bytes(out)


def serialize(positions: np.ndarray) -> bytes:
    """The deletion vector's bytes (magic + 64-bit roaring bitmap) of the row ``positions``."""
    pyroaring = _roaring()
    pos = np.unique(np.asarray(positions, dtype=np.uint64))
    high = (pos >> np.uint64(32)).astype(np.uint32)
    parts = [struct.pack("<I", MAGIC)]
    keys = np.unique(high)
    parts.append(struct.pack("<q", len(keys)))
    for k in keys:
        low = (pos[high == k] & np.uint64(0xFFFFFFFF)).astype(np.uint32)
        parts.append(struct.pack("<I", int(k)))
        parts.append(pyroaring.BitMap(low).serialize())
    return b"".join(parts)


def deserialize(data: bytes) -> np.ndarray:
    """Row positions of a deletion vector's bytes (sorted uint64)."""
    pyroaring = _roaring()
    (magic,) = struct.unpack_from("<I", data, 0)
    if magic != MAGIC:
        raise MirrorError(f"not a Delta deletion vector (magic {magic}, want {MAGIC})")
    (n,) = struct.unpack_from("<q", data, 4)
    at, out = 12, []
    for _ in range(n):
        (key,) = struct.unpack_from("<I", data, at)
        bm = pyroaring.BitMap.deserialize(data[at + 4:])
        out.append(np.asarray(bm.to_array(), dtype=np.uint64) | (np.uint64(key) << np.uint64(32)))
        at += 4 + len(bm.serialize())
    return np.concatenate(out) if out else np.zeros(0, np.uint64)


def dv_file_path(root: str, descriptor: dict) -> str:
    """The URI (a path for a local table) of the file holding a ``u`` or ``p`` deletion vector."""
    kind, ref = descriptor["storageType"], descriptor["pathOrInlineDv"]
    if kind == "u":
        prefix, encoded = ref[:-20], ref[-20:]
        name = f"deletion_vector_{uuid.UUID(bytes=z85_decode(encoded))}.bin"
        return uri.join(root, prefix, name)
    if kind == "p":
        return uri.resolve(root, ref)
    raise MirrorError(f"deletion vector storage type {kind!r} is not read here (only 'u' and 'p')")


def read_dv(store: Store, root: str, descriptor: dict | None, data_file: str = "") -> np.ndarray:
    """The deleted positions a descriptor names (none for None); inline ``i`` vectors too. One ranged read of
    the vector (size, bytes, CRC-32) at the descriptor's offset."""
    if not descriptor:
        return np.zeros(0, np.uint64)
    if descriptor["storageType"] == "i":
        return deserialize(z85_decode(descriptor["pathOrInlineDv"])[:descriptor["sizeInBytes"]])
    path = dv_file_path(root, descriptor)
    at, want = int(descriptor.get("offset") or 1), int(descriptor["sizeInBytes"])
    try:
        raw = store.read_range(path, at, 4 + want + 4)
    except NotFound as e:
        raise MirrorError(f"table {root}: the deletion vector file {path} of data file {data_file or '?'} is gone, "
                          "though the table's current version names it (removed by another tool, e.g. a vacuum "
                          "that does not read deletion vectors?): the table cannot be read as it is") from e
    (size,) = struct.unpack_from(">i", raw, 0) if len(raw) >= 4 else (-1,)
    data = raw[4:4 + max(size, 0)]
    crc = struct.unpack_from(">I", raw, 4 + size)[0] if size >= 0 and len(raw) >= 8 + size else None
    if size != want or crc is None or zlib.crc32(data) != crc:
        raise MirrorError(f"deletion vector in {path} at {descriptor.get('offset')} is damaged (size or CRC-32)")
    return deserialize(data)


def write_dv_file(store: Store, root: str, vectors: list[np.ndarray]) -> list[dict]:
    """Write ``vectors`` (deleted positions, one array per data file) as one new DV file under ``root`` (one
    put); their descriptors, in order."""
    u = uuid.uuid4()
    ref = z85_encode(u.bytes)
    out, descriptors = bytearray(b"\x01"), []
    for positions in vectors:
        data = serialize(positions)
        descriptors.append({"storageType": "u", "pathOrInlineDv": ref, "offset": len(out), "sizeInBytes": len(data),
                            "cardinality": int(len(np.unique(positions)))})
        out += struct.pack(">i", len(data)) + data + struct.pack(">I", zlib.crc32(data))
    store.put(uri.join(root, f"deletion_vector_{u}.bin"), bytes(out))
    return descriptors
