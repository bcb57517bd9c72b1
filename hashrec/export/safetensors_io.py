"""Streaming writer of the safetensors format.

A safetensors file is an 8-byte little-endian header length, a JSON header
``{name: {"dtype", "shape", "data_offsets": [begin, end]}, "__metadata__": {...}}``
padded with spaces to a multiple of 8 bytes, then the tensors' bytes back to
back. Declaring every tensor's shape first lets the header be written before
any data, so a table of any size is written chunk by chunk at known offsets and
never held in memory whole. The files read back with ``safetensors.safe_open``.
"""

from __future__ import annotations

import json
import os
import struct
from dataclasses import dataclass

import torch

from hashrec.export.errors import ExportError

_DTYPES = {
    torch.float32: "F32", torch.float16: "F16", torch.bfloat16: "BF16", torch.float64: "F64",
    torch.int64: "I64", torch.int32: "I32", torch.int8: "I8", torch.uint8: "U8",
    torch.bool: "BOOL",
}


@dataclass(frozen=True)
class TensorSlot:
    """Where one declared tensor lives in the file.

    Attributes:
        dtype: element type.
        shape: full shape.
        begin: absolute file offset of its first byte.
        row_bytes: bytes of one row (one element for 0-d and 1-d tensors' rows).
    """

    dtype: torch.dtype
    shape: tuple[int, ...]
    begin: int
    row_bytes: int


class SafetensorsWriter:
    """Writes one safetensors file whose tensors are declared up front.

    Args:
        path: the file to write (created or truncated).
        tensors: name -> (dtype, shape), in file order.
        metadata: string -> string pairs stored in ``__metadata__``.

    Use ``write(name, start_row, chunk)`` for every row range of every tensor,
    then ``close()``. Rows never written stay zero.
    """

    def __init__(self, path: str, tensors: dict[str, tuple[torch.dtype, tuple[int, ...]]],
                 metadata: dict[str, str] | None = None) -> None:
        header: dict[str, object] = {"__metadata__": dict(metadata or {})}
        layout, offset = {}, 0
        for name, (dtype, shape) in tensors.items():
            if dtype not in _DTYPES:
                raise ExportError(f"{path}: tensor {name!r} has unsupported dtype {dtype}")
            shape = tuple(int(s) for s in shape)
            numel = 1
            for size in shape:
                numel *= size
            size_bytes = numel * torch.empty(0, dtype=dtype).element_size()
            header[name] = {"dtype": _DTYPES[dtype], "shape": list(shape),
                            "data_offsets": [offset, offset + size_bytes]}
            rows = shape[0] if shape else 1
            layout[name] = (dtype, shape, offset, size_bytes // rows if rows else 0)
            offset += size_bytes
        blob = json.dumps(header, separators=(",", ":")).encode("utf-8")
        blob += b" " * (-len(blob) % 8)
        base = 8 + len(blob)
        self.path = path
        self._slots = {name: TensorSlot(d, s, base + o, r) for name, (d, s, o, r) in layout.items()}
        self._fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        os.write(self._fd, struct.pack("<Q", len(blob)) + blob)
        os.ftruncate(self._fd, base + offset)

    def write(self, name: str, start_row: int, chunk: torch.Tensor) -> None:
        """Writes ``chunk`` as rows ``[start_row, start_row + len(chunk))`` of tensor ``name``."""
        slot = self._slots[name]
        chunk = chunk.detach().to("cpu", slot.dtype).contiguous()
        expected = slot.shape[1:] if slot.shape else ()
        if slot.shape and tuple(chunk.shape[1:]) != expected:
            raise ExportError(f"{self.path}: chunk of {name!r} has shape {tuple(chunk.shape)}, "
                              f"rows of {expected} expected")
        rows = chunk.shape[0] if slot.shape else 1
        if slot.shape and start_row + rows > slot.shape[0]:
            raise ExportError(f"{self.path}: rows {start_row}..{start_row + rows} of {name!r} "
                              f"exceed its declared {slot.shape[0]} rows")
        if chunk.numel():
            data = chunk.reshape(-1).view(torch.uint8).numpy()
            os.pwrite(self._fd, data, slot.begin + start_row * slot.row_bytes)

    def close(self) -> None:
        """Flushes and closes the file."""
        if self._fd >= 0:
            os.fsync(self._fd)
            os.close(self._fd)
            self._fd = -1

    def __enter__(self) -> SafetensorsWriter:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
