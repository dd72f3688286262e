"""A key index read by range from an object store, and the executor's local disk cache of what it fetched.

A side file (:mod:`.keyindex`) is a header and three arrays checksummed per block of ``block_bytes`` (1 MiB); its
descriptor lists the first key of each block of the sorted keys. :class:`RemoteIndex` reads the header once per
process, then, for the keys a lookup searches, only the keys blocks that can hold them (by those first keys),
and for the rows it finds only the blocks of their positions and ``_seq``: a lookup's bytes grow with the
blocks its keys touch, never with the file or the table. Every fetched block is checked against its CRC-32
and kept in :class:`BlockCache`, a directory on the executor's local disk (``MSGSTREAM_KEY_CACHE_DIR``,
default ``<tmp>/msgstream-key-cache-<uid>``) bounded in bytes (``MSGSTREAM_KEY_CACHE_MB``, default 1024; the
least recently used blocks go first; set them on executors with ``spark.executorEnv.*``), shared by the
executor's Python workers and valid across batches: a side file never changes, and a rebuilt one has another
header checksum, which names its blocks. Blocks are memory-mapped from there.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import struct
import tempfile
import threading
import uuid
import zlib
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pyarrow as pa

from msgstream_spark.mirror.order import SEQ_TYPE
from msgstream_spark.mirror.store import NotFound, Store

log = logging.getLogger(__name__)

CACHE_DIR_ENV = "MSGSTREAM_KEY_CACHE_DIR"
CACHE_MB_ENV = "MSGSTREAM_KEY_CACHE_MB"
DEFAULT_CACHE_MB = 1024
HEAD_BYTES = 16 * 1024  # the first read of a side file: its descriptor (a larger one costs a second read)
FETCHERS = 8  # blocks fetched at once (object stores answer ranged GETs in parallel)
_PREFIX = struct.Struct("<8sII")


class DamagedIndex(ValueError):
    """A side file's block does not match its checksum, or is short: the index is rebuilt from the data file."""


class BlockCache:
    """Blocks of side files on this machine's disk, least recently used evicted past ``max_bytes``."""

    def __init__(self, directory: str, max_bytes: int) -> None:
        self.dir, self.max_bytes = directory, max_bytes
        self._total: int | None = None
        self._lock = threading.Lock()
        self._verified: set[str] = set()

    def _scan(self) -> list[tuple[float, int, str]]:
        out = []
        for e in os.scandir(self.dir):
            if e.name.endswith(".blk"):
                try:
                    st = e.stat()
                except FileNotFoundError:
                    continue  # evicted by another worker meanwhile
                out.append((st.st_mtime, st.st_size, e.path))
        return out

    def get(self, name: str, crc: int) -> np.ndarray | None:
        """The cached block ``name`` (memory-mapped) if it is there and matches ``crc``."""
        path = os.path.join(self.dir, name)
        try:
            got = np.memmap(path, dtype=np.uint8, mode="r")
            os.utime(path)  # recently used
        except (FileNotFoundError, ValueError):  # absent, or empty
            return None
        if name not in self._verified:
            if zlib.crc32(got) != crc:
                log.warning("key index cache block %s is damaged: fetched again", path)
                os.unlink(path)
                return None
            self._verified.add(name)
        return got

    def put(self, name: str, data: bytes) -> None:
        """Keep a verified block (written whole under a temporary name, then renamed); evict past the bound."""
        os.makedirs(self.dir, exist_ok=True)
        tmp = os.path.join(self.dir, f".{name}.{uuid.uuid4().hex}.tmp")
        with open(tmp, "wb") as f:
            f.write(data)
        os.replace(tmp, os.path.join(self.dir, name))
        self._verified.add(name)
        with self._lock:
            if self._total is None:
                self._total = sum(s for _, s, _ in self._scan())
            else:
                self._total += len(data)
            if self._total > self.max_bytes:
                self._evict()

    def _evict(self) -> None:
        entries = sorted(self._scan())
        total = sum(s for _, s, _ in entries)
        for _, size, path in entries:
            if total <= self.max_bytes * 0.8:
                break
            try:
                os.unlink(path)
                total -= size
            except FileNotFoundError:
                total -= size  # another worker evicted it
        self._total = total


_CACHE: list[BlockCache] = []


def block_cache() -> BlockCache:
    """This process's view of the executor's block cache (settings from its environment)."""
    if not _CACHE:
        d = os.environ.get(CACHE_DIR_ENV) or os.path.join(tempfile.gettempdir(), f"msgstream-key-cache-{os.getuid()}")
        mb = float(os.environ.get(CACHE_MB_ENV) or DEFAULT_CACHE_MB)
        _CACHE.append(BlockCache(d, int(mb * (1 << 20))))
    return _CACHE[0]


def _header(store: Store, side: str) -> tuple[dict, int, int] | None:
    """(descriptor, its CRC-32, where the arrays start) of a side file; None if there is none; ValueError if it
    is not a side file of this format."""
    try:
        raw = store.read_range(side, 0, HEAD_BYTES)
    except NotFound:
        return None
    if len(raw) < _PREFIX.size or raw[:8] != b"MSKEYS02":
        raise ValueError("written by an earlier release (no checksums)" if raw[:7] == b"MSKEYS0" else
                         "not a key index")
    _, n, crc = _PREFIX.unpack_from(raw)
    if _PREFIX.size + n > len(raw):
        raw += store.read_range(side, len(raw), _PREFIX.size + n - len(raw))
    body = raw[_PREFIX.size:_PREFIX.size + n]
    if len(body) != n or zlib.crc32(body) != crc:
        raise ValueError("its header's checksum")
    desc = json.loads(body)
    return desc, crc, desc["arrays"][0]["offset"]


class RemoteIndex:
    """A side file on an object store, searched by fetching blocks (the same ``find`` as ``KeyIndex``)."""

    def __init__(self, store: Store, side: str, desc: dict, crc: int, start: int) -> None:
        self.store, self.side, self.desc, self.start = store, side, desc, start
        self.rows = int(desc["rows"])
        self.block = int(desc["block_bytes"])
        self.fences = np.asarray(desc["block_first_key"], dtype=np.int64)
        self.crcs = desc["block_crc32"]
        self.payload = int(desc["file_size"]) - start
        self.tag = hashlib.sha1(f"{side}\0{desc['file_size']}\0{crc}".encode()).hexdigest()[:24]

    @classmethod
    def open(cls, store: Store, side: str, data_name: str, num_rows: int, data_size: int,
             arrays: tuple) -> RemoteIndex | None:
        """The side file's index, None if there is none; ValueError naming what does not match the data file."""
        got = _header(store, side)
        if got is None:
            return None
        desc, crc, start = got
        want = {"rows": num_rows, "data_file": data_name, "data_file_size": data_size}
        wrong = [f"{k} {desc.get(k)} != {v}" for k, v in want.items() if desc.get(k) != v]
        if wrong:
            raise ValueError(", ".join(wrong))
        if [(a["name"], a["dtype"], a["shape"][0]) for a in desc["arrays"]] != [(n, d, num_rows) for n, d, _ in arrays]:
            raise ValueError(f"arrays {desc['arrays']}")
        if "block_first_key" not in desc:
            raise ValueError("no first key per block (written before ranged reads)")
        return cls(store, side, desc, crc, start)

    def _blocks(self, ids: list[int]) -> dict[int, np.ndarray]:
        """The payload blocks ``ids``: from the local cache, the others fetched in parallel and verified."""
        cache = block_cache()
        out: dict[int, np.ndarray] = {}
        missing = []
        for j in ids:
            got = cache.get(f"{self.tag}-{j}.blk", self.crcs[j])
            if got is None:
                missing.append(j)
            else:
                out[j] = got
        if missing:
            with ThreadPoolExecutor(min(FETCHERS, len(missing))) as pool:
                fetched = pool.map(self._fetch, missing)
                for j, data in zip(missing, fetched):
                    cache.put(f"{self.tag}-{j}.blk", data)
                    out[j] = np.frombuffer(data, np.uint8)
        return out

    def _fetch(self, j: int) -> bytes:
        want = min(self.block, self.payload - j * self.block)
        data = self.store.read_range(self.side, self.start + j * self.block, want)
        if len(data) != want or zlib.crc32(data) != self.crcs[j]:
            raise DamagedIndex(f"the checksum of block {j}" if len(data) == want else "short")
        return data

    def _gather(self, offsets: np.ndarray, width: int) -> np.ndarray:
        """``width`` bytes (8 or 16) at each payload byte offset, as uint64 words (one or two per offset), read
        from each block in place (the arrays' values never cross a block: their offsets are multiples of their
        widths, and so is ``block_bytes``); joining the blocks first copied every touched block each batch."""
        ids = offsets // self.block
        uniq, ends = np.unique(ids, return_counts=True)
        got = self._blocks([int(j) for j in uniq])
        out = np.empty((len(offsets), width // 8), np.uint64)
        order, start = np.argsort(ids, kind="stable"), 0
        for j, n in zip(uniq, ends):
            sel, start = order[start:start + n], start + n
            words, first = got[int(j)].view("<u8"), (offsets[sel] % self.block) // 8
            for k in range(width // 8):
                out[sel, k] = words[first + k]
        return np.ascontiguousarray(out[:, 0]) if width == 8 else out

    def find(self, want: np.ndarray) -> tuple[np.ndarray, np.ndarray, pa.Array]:
        """(keys, row positions, ``_seq``) of every row whose key is in ``want`` (sorted, unique)."""
        idx, keys = self._search(np.asarray(want, dtype=np.int64))
        if len(idx) == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64), pa.array([], SEQ_TYPE)
        pos_at = self.desc["arrays"][1]["offset"] - self.start
        seq_at = self.desc["arrays"][2]["offset"] - self.start
        pos = self._gather(pos_at + 8 * idx, 8).view(np.int64)
        seq = np.ascontiguousarray(self._gather(seq_at + 16 * idx, 16))
        return keys, pos, pa.Array.from_buffers(SEQ_TYPE, len(idx), [None, pa.py_buffer(seq.tobytes())])

    def _search(self, want: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(sorted-order row indices, their keys) of the rows holding ``want``'s keys: each key searched in
        the run of keys blocks that can hold it (a key repeated across a block boundary spans two)."""
        if self.rows == 0 or len(want) == 0:
            return np.zeros(0, np.int64), np.zeros(0, np.int64)
        per = self.block // 8
        lo = np.maximum(np.searchsorted(self.fences, want, "left") - 1, 0)
        hi = np.maximum(np.searchsorted(self.fences, want, "right") - 1, 0)
        need = sorted({int(j) for a, b in zip(lo, hi) for j in range(a, b + 1)})
        blocks = self._blocks(need)
        idx, keys = [], []
        for b in need:  # each block searched in place for the keys that can be in it (joining copied them all)
            arr = blocks[b][:min(self.block, 8 * self.rows - b * self.block)].view("<i8")
            mine = want[(lo <= b) & (hi >= b)]
            left, right = np.searchsorted(arr, mine, "left"), np.searchsorted(arr, mine, "right")
            counts = right - left
            at = np.repeat(left, counts) + (np.arange(counts.sum()) - np.repeat(np.cumsum(counts) - counts, counts))
            idx.append(at + b * per)
            keys.append(arr[at])
        return np.concatenate(idx).astype(np.int64), np.concatenate(keys).astype(np.int64)
