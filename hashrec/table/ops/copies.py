"""Several equal-length copies in one launch: ``copy_into``.

A captured lookup's replay first copies its inputs (keys, tags, and where read the
counts, given scores and active mask) into the graph's buffers. As separate
``copy_`` calls of some 316,000 keys they took about 6 us each on an H200, well
below the copy bandwidth (``benchmarks/results/embedding_layer_gpu_persistent_trace.txt``);
one kernel moves them all.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hashrec.table.ops.launch import cdiv, fast_launch

__all__ = ["MOST_PAIRS", "copy_into"]

_BLOCK = 2048
MOST_PAIRS = 4  # pairs one launch takes


@triton.jit
def _copy(dst, src, i, mask):
    tl.store(dst + i, tl.load(src + i, mask=mask), mask=mask)


# n stays specialized: unspecialized the kernel took 230 registers and 968 SASS
# instructions against 61 and 288 (compiled for sm_90:
# benchmarks/results/specialization_cost.md), at the cost of a variant for copies whose
# length is not a multiple of 16.
@fast_launch
@triton.jit
def _copy_kernel(d0, s0, d1, s1, d2, s2, d3, s3, n, COUNT: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    _copy(d0, s0, i, mask)
    if COUNT > 1:
        _copy(d1, s1, i, mask)
    if COUNT > 2:
        _copy(d2, s2, i, mask)
    if COUNT > 3:
        _copy(d3, s3, i, mask)


def copy_into(pairs: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
    """``dst.copy_(src)`` for every (dst, src) of ``pairs``: contiguous CUDA tensors of
    one length n (each pair of one dtype), at most four pairs, in one launch."""
    if not pairs or len(pairs) > MOST_PAIRS:
        raise ValueError(f"copy_into takes 1 to {MOST_PAIRS} pairs, got {len(pairs)}")
    n = pairs[0][0].numel()
    for dst, src in pairs:
        if dst.numel() != n or src.numel() != n or dst.dtype != src.dtype:
            raise ValueError("copy_into's pairs must share their length, and each its dtype")
        if not (dst.is_contiguous() and src.is_contiguous()):
            raise ValueError("copy_into's tensors must be contiguous")
    if n == 0:
        return
    flat = [t.view(torch.uint8) if t.dtype == torch.bool else t for pair in pairs
            for t in pair]
    flat += [flat[0]] * (2 * MOST_PAIRS - len(flat))
    _copy_kernel[(cdiv(n, _BLOCK),)](*flat, n, COUNT=len(pairs), BLOCK=_BLOCK)
