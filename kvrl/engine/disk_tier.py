"""The disk tier under the CPU tier (issue #20): a file-backed block store with asynchronous I/O.

:class:`DiskStore` keeps disk-tier blocks ``0..num_blocks-1`` as one file per block
(``<dir>/block-<n>.kv``, the block's KV bytes as the executor's host tier holds them) and moves
them with a thread pool: a write is queued and returns at once (the bytes were copied out of the
host tier first, so the host block can be reused at once); a read is queued and waited for before
the step whose tier load needs it (or queued earlier, into a staging buffer, by the read-ahead of
:mod:`kvrl.engine.tier_read_ahead`). Every I/O on a block waits for the block's previous I/O (a
read never sees a half-written file, a rewrite never overtakes a read; a read after a failed
write fails too). The index (which
identity lives in which disk block, replacement order) is a :class:`~kvrl.engine.tier_store.CpuTier`
instance, the same structure the CPU tier uses; this module moves bytes only.

:class:`DiskBandwidth` prices disk I/O in the sim: bytes per second for reads and writes of whole
block files, measured by :func:`measure_disk_bandwidth` (``kvrl-profile`` records it in the
profile's ``meta["disk"]``) or, when a profile lacks it, :data:`DEFAULT_DISK_BANDWIDTH`.

Units: bytes, seconds.
"""
from __future__ import annotations

import os
import shutil
import tempfile
import threading
import time
import weakref
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from typing import Optional

import numpy as np


@dataclass(frozen=True)
class DiskBandwidth:
    """Sustained disk throughput of whole-block file I/O (bytes per second) and where it came from."""

    read_bytes_per_s: float
    write_bytes_per_s: float
    source: str = "default"

    def __post_init__(self) -> None:
        for name in ("read_bytes_per_s", "write_bytes_per_s"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and value > 0):
                raise ValueError(f"disk bandwidth {name} must be a positive number, got {value!r}")

    def read_s(self, num_bytes: float) -> float:
        return num_bytes / self.read_bytes_per_s

    def write_s(self, num_bytes: float) -> float:
        return num_bytes / self.write_bytes_per_s

    @classmethod
    def from_meta(cls, meta: Optional[dict]) -> "DiskBandwidth":
        """The ``disk`` entry of a profile's metadata, or :data:`DEFAULT_DISK_BANDWIDTH` when absent."""
        disk = (meta or {}).get("disk")
        if not disk:
            return DEFAULT_DISK_BANDWIDTH
        return cls(float(disk["read_bytes_per_s"]), float(disk["write_bytes_per_s"]),
                   f"profile ({disk.get('dir', '?')}, {disk.get('file_bytes', '?')}-byte files)")


#: Used when a profile has no disk measurement (profiles written before the disk tier, and the
#: roofline): a datacenter NVMe SSD's order of magnitude for large sequential transfers, 3 GB/s
#: read and 1.5 GB/s write. Not a measurement: run ``kvrl-profile`` on the serving machine (it
#: records ``meta["disk"]``) for the numbers that machine's sim should use.
DEFAULT_DISK_BANDWIDTH = DiskBandwidth(3.0e9, 1.5e9, "default (nominal NVMe: 3 GB/s read, 1.5 GB/s write)")


class DiskStore:
    """Block files in ``directory`` (a fresh temporary one, removed at :meth:`close`, when None).

    ``block_bytes`` is the size of one block file; ``threads`` the reader threads and, apart, the writer threads. Reads and
    writes take and fill byte arrays (``np.uint8``, ``block_bytes`` long); both return a
    :class:`~concurrent.futures.Future` (result: seconds the I/O took in its worker).
    """

    def __init__(self, num_blocks: int, block_bytes: int, directory: Optional[str] = None, threads: int = 4) -> None:
        if threads < 1:
            raise ValueError(f"engine.disk_tier_threads must be >= 1, got {threads!r}")
        self.num_blocks, self.block_bytes = num_blocks, block_bytes
        self._owned = directory is None
        self.directory = tempfile.mkdtemp(prefix="kvrl-disk-tier-") if directory is None else os.fspath(directory)
        os.makedirs(self.directory, exist_ok=True)
        # separate reader and writer threads: a read (the next step waits for it) never queues
        # behind a backlog of demotion writes of other blocks
        self._readers = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="kvrl-disk-read")
        self._writers = ThreadPoolExecutor(max_workers=threads, thread_name_prefix="kvrl-disk-write")
        self._last: dict[int, tuple[Future, bool]] = {}   # block -> its latest queued I/O, is a write
        self.read_s = self.write_s = 0.0             # worker seconds spent reading / writing
        self._lock = threading.Lock()
        self._closer = weakref.finalize(self, DiskStore._shutdown, (self._readers, self._writers),
                                        self.directory if self._owned else None)

    def path(self, block: int) -> str:
        return os.path.join(self.directory, f"block-{block}.kv")

    def _after(self, block: int, fn, pool: ThreadPoolExecutor, write: bool) -> Future:
        """``fn`` queued on ``pool`` after the block's previous I/O has finished. Each I/O reports
        its own failure through its future, except that a read after a failed write fails too (the
        file may hold part of the block); a failed read does not affect later I/O."""
        before = self._last.get(block)
        path = self.path(block)         # the worker holds no reference to the store (its finalizer)

        def run():
            if before is not None:
                previous, was_write = before
                wait([previous])
                if not write and was_write and previous.exception() is not None:
                    raise IOError(f"{path}: the block's last write failed ({previous.exception()})")
            return fn()
        future = pool.submit(run)
        self._last[block] = (future, write)
        return future

    def write(self, block: int, data: np.ndarray) -> Future:
        """Queue writing ``data`` (a private copy: the caller may reuse its source at once) to ``block``."""
        if data.nbytes != self.block_bytes:
            raise ValueError(f"disk block {block}: {data.nbytes} bytes, the store holds {self.block_bytes}-byte blocks")
        path = self.path(block)

        def do():
            t0 = time.perf_counter()
            with open(path, "wb") as f:
                f.write(memoryview(data).cast("B"))
            dt = time.perf_counter() - t0
            with self._lock:
                self.write_s += dt
            return dt
        return self._after(block, do, self._writers, True)

    def read(self, block: int, into: np.ndarray) -> Future:
        """Queue reading ``block`` into ``into`` (contiguous, ``block_bytes`` long)."""
        if into.nbytes != self.block_bytes:
            raise ValueError(f"disk block {block}: a {into.nbytes}-byte buffer for {self.block_bytes}-byte blocks")
        path = self.path(block)

        def do():
            t0 = time.perf_counter()
            with open(path, "rb") as f:
                n = f.readinto(memoryview(into).cast("B"))
            if n != self.block_bytes:
                raise IOError(f"{path}: read {n} of {self.block_bytes} bytes")
            dt = time.perf_counter() - t0
            with self._lock:
                self.read_s += dt
            return dt
        return self._after(block, do, self._readers, False)

    def drain(self) -> None:
        """Wait for every queued I/O, re-raising the first failed write (a failed read is its
        caller's to handle, through the future :meth:`read` returned)."""
        last = list(self._last.values())
        wait([future for future, _ in last])
        for future, write in last:
            if write:
                future.result()

    def close(self) -> None:
        self.drain()
        self._closer()

    @staticmethod
    def _shutdown(pools: tuple, directory: Optional[str]) -> None:
        # the last reference may go in one of the pools' own workers (a queued I/O holds the
        # store): a worker cannot join itself, and its pool finishes its queue anyway
        in_worker = threading.current_thread().name.startswith("kvrl-disk-")
        for pool in pools:
            pool.shutdown(wait=not in_worker)
        if directory is not None:
            shutil.rmtree(directory, ignore_errors=True)


def _drop_page_cache(path: str) -> None:
    """Ask the kernel to forget ``path``'s cached pages (so a read measures the disk); a no-op
    where posix_fadvise is missing."""
    if hasattr(os, "posix_fadvise"):
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def measure_disk_bandwidth(directory: Optional[str] = None, block_bytes: int = 2 << 20, num_blocks: int = 64,
                           threads: int = 4) -> dict:
    """Time ``num_blocks`` block files of ``block_bytes`` written then read through
    :class:`DiskStore` (the tier's own I/O path) in ``directory`` (a temporary one when None).

    Writes are timed to durable (each file fsynced); reads after the files' pages were dropped from
    the page cache (posix_fadvise DONTNEED; where the kernel ignores it the read figure is a page
    cache one). Returns the profile's ``meta["disk"]`` entry: ``read_bytes_per_s``,
    ``write_bytes_per_s``, ``file_bytes``, ``files``, ``threads``, ``dir``.
    """
    store = DiskStore(num_blocks, block_bytes, directory=None if directory is None else
                      tempfile.mkdtemp(prefix="kvrl-disk-bw-", dir=directory), threads=threads)
    try:
        data = np.random.default_rng(0).integers(0, 255, block_bytes, dtype=np.uint8)
        t0 = time.perf_counter()
        for b in range(num_blocks):
            store.write(b, data)
        store.drain()
        for b in range(num_blocks):
            fd = os.open(store.path(b), os.O_RDONLY)
            os.fsync(fd)
            os.close(fd)
        write_s = time.perf_counter() - t0
        for b in range(num_blocks):
            _drop_page_cache(store.path(b))
        bufs = [np.empty(block_bytes, dtype=np.uint8) for _ in range(num_blocks)]
        t0 = time.perf_counter()
        for b in range(num_blocks):
            store.read(b, bufs[b])
        store.drain()
        read_s = time.perf_counter() - t0
        if not all(np.array_equal(buf, data) for buf in bufs):
            raise IOError(f"disk bandwidth measurement in {store.directory}: read back differs from what was written")
        total = block_bytes * num_blocks
        return {"read_bytes_per_s": total / read_s, "write_bytes_per_s": total / write_s, "file_bytes": block_bytes,
                "files": num_blocks, "threads": threads, "dir": directory or tempfile.gettempdir()}
    finally:
        owned = directory is not None
        store.close()
        if owned:
            shutil.rmtree(store.directory, ignore_errors=True)


__all__ = ["DEFAULT_DISK_BANDWIDTH", "DiskBandwidth", "DiskStore", "measure_disk_bandwidth"]
