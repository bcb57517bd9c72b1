"""Rows spread over two tensors, addressed as one: index i < split is ``first[i]``, the
rest is ``second[i - split]``.

HYBRID keeps ``first`` in GPU memory and ``second`` in pinned host memory (slot =
index); CACHING keeps the GPU cache in ``first`` and the full host copy in
``second`` (index = cache slot, or split + logical slot). On CUDA the Triton
kernels of ``two_part_triton`` read and write the pinned host rows in place
through unified virtual addressing (UVA); where that is unavailable, or on CPU,
the reference path below stages host rows through index ops on the host.
"""

from __future__ import annotations

import functools
import logging

import torch

from hashrec.table.ops.optimizer import apply_sparse_update
from hashrec.table.optim import OptimizerSpec

logger = logging.getLogger(__name__)

UVA = "uva"
STAGED = "staged"
HOST = "host"


def allocate_host(rows: int, row_dim: int, dtype: torch.dtype,
                  device: torch.device) -> torch.Tensor:
    """Zeroed (rows, row_dim) host tensor; pinned when ``device`` is CUDA."""
    pin = device.type == "cuda"
    return torch.zeros(max(rows, 1), row_dim, dtype=dtype, pin_memory=pin)


@functools.cache
def host_access(device_type: str) -> str:
    """How kernels on ``device_type`` reach host rows: "uva" (in place, Triton),
    "staged" (host index ops and copies) or "host" (the compute device is the host)."""
    if device_type != "cuda":
        return HOST
    try:
        from hashrec.table.tiers import two_part_triton
        ok = two_part_triton.probe_uva()
    except Exception as exc:  # any failure to reach pinned memory from a kernel
        logger.warning("pinned host rows are not reachable from Triton kernels (%s); "
                       "host rows are staged through copies", exc)
        return STAGED
    if not ok:
        logger.warning("a Triton kernel read wrong values from pinned host memory; host rows "
                       "are staged through copies")
    return UVA if ok else STAGED


class TwoPartRows:
    """Two row tensors addressed as one index space (see the module docstring).

    Args:
        first: (>= split, row_dim) rows of index [0, split) on the compute device.
        second: (R, row_dim) rows of index [split, split + R), on the compute device
            or in (pinned) host memory.
        split: number of indices served by ``first``.
        device: the compute device (where indices, gradients and outputs live).
    """

    def __init__(self, first: torch.Tensor, second: torch.Tensor, split: int,
                 device: torch.device) -> None:
        self.first, self.second, self.split, self.device = first, second, split, device
        self.mode = host_access(device.type) if second.device != device else HOST

    @property
    def row_dim(self) -> int:
        return self.first.shape[1]

    def gather(self, index: torch.Tensor, start: int = 0,
               width: int | None = None) -> torch.Tensor:
        """index (n,) int64 -> rows (n, width) of columns [start, start + width)."""
        width = self.row_dim - start if width is None else width
        if self.mode == UVA:
            from hashrec.table.tiers import two_part_triton
            return two_part_triton.gather(self.first, self.second, self.split, index, start,
                                          width)
        out = torch.empty(index.numel(), width, dtype=self.first.dtype, device=self.device)
        near, far = _parts(index, self.split)
        columns = slice(start, start + width)
        out.index_copy_(0, near, self.first[:, columns].index_select(0, index[near]))
        if far.numel():
            rows = index[far].to(self.second.device) - self.split
            out.index_copy_(0, far, self.second[:, columns].index_select(0, rows).to(self.device))
        return out

    def scatter(self, index: torch.Tensor, rows: torch.Tensor, start: int = 0) -> None:
        """Writes rows (n, w) into columns [start, start + w) of unique ``index`` (n,)."""
        rows = rows.to(self.first.dtype)
        if self.mode == UVA:
            from hashrec.table.tiers import two_part_triton
            two_part_triton.scatter(self.first, self.second, self.split, index, rows, start)
            return
        columns = slice(start, start + rows.shape[1])
        near, far = _parts(index, self.split)
        self.first[:, columns].index_copy_(0, index[near], rows.index_select(0, near))
        if far.numel():
            where = index[far].to(self.second.device) - self.split
            self.second[:, columns].index_copy_(
                0, where, rows.index_select(0, far).to(self.second.device))

    def copy(self, src: torch.Tensor, dst: torch.Tensor) -> None:
        """Copies whole rows from unique-or-not ``src`` (n,) to unique ``dst`` (n,)."""
        if src.numel():
            self.scatter(dst, self.gather(src))

    def update(self, index: torch.Tensor, grads: torch.Tensor, spec: OptimizerSpec, lr: float,
               step: int) -> None:
        """Optimizer step on unique ``index`` (u,) with grads (u, dim) (embedding + state)."""
        if self.mode == UVA:
            from hashrec.table.tiers import two_part_triton
            two_part_triton.update(self.first, self.second, self.split, index, grads, spec, lr,
                                   step)
            return
        near, far = _parts(index, self.split)
        if near.numel():
            apply_sparse_update(self.first, index[near], grads[near], spec, lr, step)
        if far.numel() == 0:
            return
        if self.mode == HOST:
            apply_sparse_update(self.second, index[far] - self.split, grads[far], spec, lr, step)
            return
        staged = self.gather(index[far])  # STAGED: update a device copy, write it back
        apply_sparse_update(staged, torch.arange(far.numel(), device=self.device), grads[far],
                            spec, lr, step)
        self.scatter(index[far], staged)

    def nbytes(self) -> tuple[int, int]:
        """(bytes of ``first``, bytes of ``second``)."""
        return (self.first.numel() * self.first.element_size(),
                self.second.numel() * self.second.element_size())


def _parts(index: torch.Tensor, split: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Positions of ``index`` served by the first part and by the second."""
    near = index < split
    return torch.nonzero(near).flatten(), torch.nonzero(~near).flatten()
