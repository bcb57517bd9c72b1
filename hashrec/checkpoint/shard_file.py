"""Self-describing shard files: a JSON header next to raw little-endian arrays.

A shard is two files that share a stem:

* ``<stem>.bin`` holds the arrays back to back, chunk after chunk, as raw
  little-endian bytes (bfloat16 is stored as its 16-bit pattern);
* ``<stem>.json`` is written after the data and describes it: format name and
  version, caller attributes (table, dims, rank ...), the total data size, and
  per section (``rows``, ``admission``, ``evicted``) the chunks with, per array,
  dtype, shape, byte offset, byte size and an xxh3-64 checksum.

Writers stream chunk by chunk and readers verify and yield one chunk at a time,
so neither holds more than one chunk in memory. Any mismatch (missing file,
truncated data, bad checksum, unknown dtype) raises ``CheckpointError`` naming
the file.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
import xxhash

from hashrec.checkpoint.chunk_write import start_writeback, submit, write_chunk_arrays
from hashrec.checkpoint.errors import CheckpointDamagedError, CheckpointError
from hashrec.checkpoint.pipeline import WriteBehind

SHARD_FORMAT = "hashrec-shard"
SHARD_FORMAT_VERSION = 1

# torch dtype name -> (torch dtype, little-endian numpy storage dtype, torch view dtype)
_DTYPES: dict[str, tuple[torch.dtype, str, torch.dtype]] = {
    "int64": (torch.int64, "<i8", torch.int64),
    "int32": (torch.int32, "<i4", torch.int32),
    "uint8": (torch.uint8, "|u1", torch.uint8),
    "float64": (torch.float64, "<f8", torch.float64),
    "float32": (torch.float32, "<f4", torch.float32),
    "float16": (torch.float16, "<f2", torch.float16),
    "bfloat16": (torch.bfloat16, "<i2", torch.int16),
}
_NAME_OF = {spec[0]: name for name, spec in _DTYPES.items()}


def dtype_name(dtype: torch.dtype) -> str:
    """Name under which ``dtype`` is stored; raises CheckpointError if unsupported."""
    if dtype not in _NAME_OF:
        raise CheckpointError(f"dtype {dtype} cannot be stored; allowed: {sorted(_DTYPES)}")
    return _NAME_OF[dtype]


def dtype_from_name(name: str, where: str) -> torch.dtype:
    """The torch dtype stored under ``name``; ``where`` names the file for errors."""
    if name not in _DTYPES:
        raise CheckpointError(f"{where}: unknown dtype {name!r}; allowed: {sorted(_DTYPES)}")
    return _DTYPES[name][0]


def fsync_dir(path: str) -> None:
    """Flushes a directory entry (new or renamed files) to stable storage."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _as_numpy(tensor: torch.Tensor) -> tuple[np.ndarray, Any]:
    """A contiguous little-endian host view of ``tensor``'s bytes, and the CUDA event
    after which the view holds them (None when it does already).

    A CUDA tensor is copied into page-locked memory asynchronously on its device's
    current stream, so later work on that stream is ordered after the copy and the
    caller does not wait for it; whoever reads the view waits for the event.
    """
    name = dtype_name(tensor.dtype)
    _, np_dtype, view_dtype = _DTYPES[name]
    tensor = tensor.detach()
    ready = None
    if tensor.device.type == "cpu":
        host = tensor.contiguous()
    elif tensor.device.type == "cuda":
        host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        host.copy_(tensor, non_blocking=True)
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream(tensor.device))
    else:  # one copy into page-locked memory: a faster device-to-host transfer
        host = torch.empty(tensor.shape, dtype=tensor.dtype, pin_memory=True)
        host.copy_(tensor)
    if view_dtype != host.dtype:
        host = host.view(view_dtype)
    array = host.numpy()
    if sys.byteorder != "little":
        if ready is not None:
            ready.synchronize()
            ready = None
        array = array.astype(np_dtype)
    return array, ready


class ShardWriter:
    """Streams chunks of named arrays into ``<stem>.bin``; ``close`` writes ``<stem>.json``.

    Args:
        stem: path without extension.
        attrs: JSON-serializable attributes stored in the header.
    """

    def __init__(self, stem: str, attrs: dict[str, Any]) -> None:
        self._stem = stem
        self._attrs = dict(attrs)
        self._sections: dict[str, dict[str, Any]] = {}
        self._offset = 0
        self._file = open(stem + ".bin", "wb", buffering=0)  # noqa: SIM115 - closed in close()
        self._behind = WriteBehind(depth=1)
        self._writebacks: list = []  # pending start_writeback calls, done before the fsync

    def write_chunk(self, section: str, arrays: dict[str, torch.Tensor]) -> None:
        """Appends one chunk of ``section``; all arrays share their first dimension.

        Checksums and the write run on background threads while the caller prepares
        the next chunk: CPU arrays must stay unchanged until the next ``write_chunk``
        or ``close`` returns (an error of that write is raised there). CUDA arrays are
        copied to the host on their device's current stream without waiting.
        """
        counts = {int(t.shape[0]) for t in arrays.values()}
        if len(counts) != 1:
            raise CheckpointError(f"{self._stem}.bin: arrays of one chunk differ in length")
        count = counts.pop()
        entry: dict[str, Any] = {"count": count, "arrays": {}}
        start = self._offset
        pending = []
        ready = []
        for name, tensor in arrays.items():
            array, event = _as_numpy(tensor)
            array = array.reshape(-1)
            if event is not None:
                ready.append(event)
            entry["arrays"][name] = {
                "dtype": dtype_name(tensor.dtype),
                "shape": list(tensor.shape),
                "offset": self._offset,
                "nbytes": array.nbytes,
            }
            pending.append((entry["arrays"][name], array))
            self._offset += array.nbytes
        # checksums and the write run behind the caller's next export
        self._behind.submit(lambda: self._write_arrays(pending, ready, start))
        section_entry = self._sections.setdefault(section, {"count": 0, "chunks": []})
        section_entry["count"] += count
        section_entry["chunks"].append(entry)

    def _write_arrays(self, pending: list[tuple[dict[str, Any], np.ndarray]],
                      ready: list[Any], start: int) -> None:
        for event in ready:  # device-to-host copies of this chunk
            event.synchronize()
        digests = write_chunk_arrays(self._file, [array for _, array in pending])
        for (spec, _), digest in zip(pending, digests):
            spec["xxh3_64"] = digest
        nbytes = sum(array.nbytes for _, array in pending)
        self._writebacks = [f for f in self._writebacks if not f.done()]
        self._writebacks.append(submit(start_writeback, self._file.fileno(), start, nbytes))

    def _wait_writebacks(self) -> None:
        writebacks, self._writebacks = self._writebacks, []
        for future in writebacks:
            future.result()

    def ensure_section(self, section: str) -> None:
        """Declares ``section`` even if no chunk is written (an empty section)."""
        self._sections.setdefault(section, {"count": 0, "chunks": []})

    def close(self) -> dict[str, Any]:
        """Fsyncs the data, writes and fsyncs the header; returns the header."""
        try:
            self._behind.finish()
            self._wait_writebacks()
        except BaseException:
            self.abort()
            raise
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        header = {
            "format": SHARD_FORMAT,
            "version": SHARD_FORMAT_VERSION,
            "byteorder": "little",
            "data_file": os.path.basename(self._stem) + ".bin",
            "data_bytes": self._offset,
            "attrs": self._attrs,
            "sections": self._sections,
        }
        with open(self._stem + ".json", "w", encoding="utf-8") as f:
            json.dump(header, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        return header

    def abort(self) -> None:
        """Closes the data file without writing a header (the shard stays incomplete)."""
        self._behind.finish(raise_error=False)
        for future in self._writebacks:
            future.exception()  # waits; a hint that failed needs no report here
        self._writebacks = []
        if not self._file.closed:
            self._file.close()


def read_versioned_json(path: str, format_name: str, version: int,
                        missing_hint: str = "") -> dict[str, Any]:
    """Reads a JSON object whose ``format`` and ``version`` fields must match.

    Raises:
        CheckpointError: naming ``path`` when it is missing, truncated, or of another
            format or version.
    """
    try:
        with open(path, encoding="utf-8") as f:
            content = json.load(f)
    except FileNotFoundError:
        raise CheckpointDamagedError(f"{path}: missing{missing_hint}") from None
    except (OSError, ValueError) as e:
        raise CheckpointDamagedError(f"{path}: unreadable or truncated ({e})") from None
    if not isinstance(content, dict) or content.get("format") != format_name:
        raise CheckpointError(f"{path}: not a {format_name} file")
    if content.get("version") != version:
        raise CheckpointError(
            f"{path}: {format_name} version {content.get('version')!r} is not supported; "
            f"this build reads version {version}")
    return content


class ShardReader:
    """Reads a shard written by ``ShardWriter``, verifying sizes and checksums.

    Args:
        stem: path without extension.

    Raises:
        CheckpointError: header missing or invalid, data file missing or of the wrong size.
    """

    def __init__(self, stem: str) -> None:
        self.stem = stem
        self.header = read_versioned_json(stem + ".json", SHARD_FORMAT, SHARD_FORMAT_VERSION,
                                          " (shard header)")
        self.data_path = os.path.join(os.path.dirname(stem), self.header["data_file"])
        try:
            size = os.path.getsize(self.data_path)
        except OSError:
            raise CheckpointDamagedError(f"{self.data_path}: shard data file is missing") from None
        if size != self.header["data_bytes"]:
            raise CheckpointDamagedError(
                f"{self.data_path}: shard data is {size} bytes, header says "
                f"{self.header['data_bytes']} (truncated or overwritten)")

    @property
    def attrs(self) -> dict[str, Any]:
        """Caller attributes stored in the header."""
        return self.header["attrs"]

    def count(self, section: str) -> int:
        """Number of entries in ``section`` (0 if absent)."""
        return int(self.header["sections"].get(section, {}).get("count", 0))

    def has_section(self, section: str) -> bool:
        """Whether the header declares ``section``."""
        return section in self.header["sections"]

    def iter_chunks(self, section: str,
                    pin_memory: bool = False) -> Iterator[dict[str, torch.Tensor]]:
        """Yields the chunks of ``section`` as dicts of CPU tensors, one chunk in memory.

        ``pin_memory`` reads into page-locked memory (for fast copies to a GPU).
        """
        chunks = self.header["sections"].get(section, {}).get("chunks", [])
        with open(self.data_path, "rb", buffering=0) as f:
            for chunk in chunks:
                yield self._read_chunk(f, chunk, pin_memory)

    def _read_chunk(self, f: Any, chunk: dict[str, Any],
                    pin_memory: bool) -> dict[str, torch.Tensor]:
        arrays = chunk["arrays"]
        if not arrays:
            return {}
        start = min(a["offset"] for a in arrays.values())
        end = max(a["offset"] + a["nbytes"] for a in arrays.values())
        if pin_memory:
            buffer = torch.empty(end - start, dtype=torch.uint8, pin_memory=True).numpy()
        else:
            buffer = np.empty(end - start, dtype=np.uint8)
        f.seek(start)
        view = memoryview(buffer)
        while view.nbytes:  # a raw read may return fewer bytes than asked
            got = f.readinto(view)
            if not got:
                raise CheckpointDamagedError(
                    f"{self.data_path}: unexpected end of data (truncated)")
            view = view[got:]
        out = {}
        for name, spec in arrays.items():
            out[name] = self._decode(buffer, start, name, spec)
        return out

    def _decode(self, buffer: np.ndarray, start: int, name: str,
                spec: dict[str, Any]) -> torch.Tensor:
        dtype = dtype_from_name(spec["dtype"], self.data_path)
        _, np_dtype, view_dtype = _DTYPES[spec["dtype"]]
        raw = buffer[spec["offset"] - start: spec["offset"] - start + spec["nbytes"]]
        if xxhash.xxh3_64_hexdigest(raw) != spec["xxh3_64"]:
            raise CheckpointDamagedError(
                f"{self.data_path}: checksum mismatch in array {name!r} at byte "
                f"{spec['offset']} (file corrupted)")
        array = raw.view(np.dtype(np_dtype))
        if sys.byteorder != "little":
            array = array.astype(np.dtype(np_dtype).newbyteorder("="))
        numel = int(np.prod(spec["shape"])) if spec["shape"] else 1
        if array.size != numel:
            raise CheckpointDamagedError(
                f"{self.data_path}: array {name!r} has {array.size} elements, shape "
                f"{spec['shape']} needs {numel}")
        tensor = torch.from_numpy(array).view(view_dtype).reshape(spec["shape"])
        return tensor if view_dtype == dtype else tensor.view(dtype)
