"""Test helpers: count the operators whose results the host reads, and run worker
processes with the Triton ops interpreted on CPU tensors."""

from __future__ import annotations

import collections
import contextlib
import os

import torch
from torch.utils._python_dispatch import TorchDispatchMode

aten = torch.ops.aten
READS = {aten.nonzero, aten._local_scalar_dense, aten.masked_select, aten.is_nonzero,
         aten._unique2, aten.unique_dim, aten.unique_consecutive}


class HostReads(TorchDispatchMode):
    """Counts aten calls whose output size or value is read on the host (and, with
    ``tolist``, ``Tensor.tolist`` calls)."""

    def __init__(self, tolist: bool = False) -> None:
        super().__init__()
        self.counts: collections.Counter[str] = collections.Counter()
        self._count_tolist = tolist

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        packet = func._overloadpacket
        if packet in READS:
            self.counts[str(packet)] += 1
        elif packet in (aten.index, aten.index_put, aten.index_put_):
            if any(i is not None and i.dtype == torch.bool for i in args[1]):
                self.counts[f"{packet}(bool mask)"] += 1
        elif packet is aten.repeat_interleave and kwargs.get("output_size") is None:
            self.counts[str(packet)] += 1
        return func(*args, **kwargs)

    def __enter__(self):
        if self._count_tolist:
            self._tolist = torch.Tensor.tolist
            counts, tolist = self.counts, self._tolist

            def counted(tensor):
                counts["tolist"] += 1
                return tolist(tensor)

            torch.Tensor.tolist = counted
        return super().__enter__()

    def __exit__(self, *exc):
        if self._count_tolist:
            torch.Tensor.tolist = self._tolist
        return super().__exit__(*exc)


@contextlib.contextmanager
def interpreted_triton(enabled: bool = True):
    """Processes started inside run the Triton ops in the interpreter on CPU tensors
    (``HASHREC_FORCE_TRITON=1``, ``TRITON_INTERPRET=1``)."""
    env = {"HASHREC_FORCE_TRITON": "1", "TRITON_INTERPRET": "1"} if enabled else {}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def forced_triton():
    """In this process, the tables' ops take the Triton path on CPU tensors too
    (``HASHREC_FORCE_TRITON=1``; the kernels interpreted where ``TRITON_INTERPRET=1``)."""
    from hashrec.table.ops import dispatch

    dispatch._forced.cache_clear()
    os.environ["HASHREC_FORCE_TRITON"] = "1"
    try:
        yield
    finally:
        os.environ.pop("HASHREC_FORCE_TRITON", None)
        dispatch._forced.cache_clear()
