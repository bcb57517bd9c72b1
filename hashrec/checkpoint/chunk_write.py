"""Writing one chunk of a shard: checksums beside the write, early writeback.

``write_chunk_arrays`` checksums a chunk's arrays (xxh3-64, one digest per array)
on a small shared thread pool while the calling thread writes them to the file
with one gathered ``os.writev`` call: xxhash and the write both release the GIL,
so the checksums cost no time beside the write. ``start_writeback`` hands a
written byte range to the kernel for writing to disk (``sync_file_range`` where
the C library has it, a no-op elsewhere), so the disk works while later chunks
are prepared and the final fsync has little left to do; it never replaces that
fsync, which still decides durability and reports I/O errors.
"""

from __future__ import annotations

import ctypes
import functools
import os
import sys
import threading
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import xxhash

_SYNC_FILE_RANGE_WRITE = 2  # start writeback of dirty pages in the range, do not wait


_POOL: dict[int, ThreadPoolExecutor] = {}  # by process id: a forked child makes its own
_POOL_LOCK = threading.Lock()


def _pool() -> ThreadPoolExecutor:
    """Threads shared by every open shard writer of this process (created on first use)."""
    pid = os.getpid()
    with _POOL_LOCK:
        if pid not in _POOL:  # the parent's threads do not exist in a forked child
            _POOL.clear()
            _POOL[pid] = ThreadPoolExecutor(max_workers=max(2, min(4, os.cpu_count() or 1)),
                                            thread_name_prefix="checkpoint-checksum")
        return _POOL[pid]


def submit(job: Callable[..., Any], *args: Any) -> Future:
    """Runs ``job(*args)`` on the shared pool."""
    return _pool().submit(job, *args)


def _write_all(file: Any, views: list[memoryview]) -> None:
    """Writes ``views`` back to back at the file's position, resuming short writes."""
    views = [v for v in views if v.nbytes]
    if not hasattr(os, "writev"):
        for view in views:
            while view.nbytes:
                view = view[file.write(view):]
        return
    fd = file.fileno()
    while views:
        done = os.writev(fd, views[:1024])  # at most IOV_MAX buffers per call
        if done <= 0:
            raise OSError(f"write to {file.name!r} made no progress")
        while views and done >= views[0].nbytes:
            done -= views[0].nbytes
            views.pop(0)
        if done:
            views[0] = views[0][done:]


def write_chunk_arrays(file: Any, arrays: list[np.ndarray]) -> list[str]:
    """Writes contiguous ``arrays`` back to back at ``file``'s position (an unbuffered
    binary file); returns their xxh3-64 hex digests, in order.

    Every checksum has finished when this returns, also when the write raises.
    """
    digests = [submit(xxhash.xxh3_64_hexdigest, array) for array in arrays]
    try:
        _write_all(file, [memoryview(array).cast("B") for array in arrays])
    finally:
        out = [digest.result() for digest in digests]
    return out


@functools.cache
def _sync_file_range() -> Callable[..., int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        function = ctypes.CDLL(None, use_errno=True).sync_file_range
    except (OSError, AttributeError):
        return None
    function.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    function.restype = ctypes.c_int
    return function


def start_writeback(fd: int, offset: int, nbytes: int) -> None:
    """Asks the kernel to start writing bytes [offset, offset + nbytes) of ``fd`` to
    disk without waiting. A hint only: a failure shows up in the final fsync."""
    function = _sync_file_range()
    if function is not None and nbytes > 0:
        function(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE)
