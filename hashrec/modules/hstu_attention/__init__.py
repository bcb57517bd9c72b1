"""HSTU's pointwise attention, ``hstu_attention``, dispatched by device.

    out[b, n, h] = sum over m of silu(alpha <q[b, n, h], k[b, m, h]>) / divisor
                   * allowed[b, n, m] * v[b, m, h]

``reference.py`` is the CPU path and the kernels' oracle: it builds the (B, H, L, L)
weights in memory. ``triton.py`` computes them tile by tile in registers, forward and
backward, and stores none of them; CUDA tensors take it where ``HASHREC_HSTU_KERNELS=1``
(``HASHREC_FORCE_TRITON=1`` runs it on any device, interpreted on the CPU). Shapes and
arguments: ``reference.hstu_attention``.
"""

from __future__ import annotations

import functools
import os

import torch

from hashrec.modules.hstu_attention import reference
from hashrec.table.ops.dispatch import backend


def hstu_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   allowed: torch.Tensor, alpha: float, divisor: float) -> torch.Tensor:
    """q, k (B, L, H, A), v (B, L, H, Dv), allowed (B, L, L) or (L, L) bool ->
    (B, L, H, Dv). Scripted, the reference (exported models run it on any device)."""
    if torch.jit.is_scripting():
        return reference.hstu_attention(q, k, v, allowed, alpha, divisor)
    return _dispatched(q, k, v, allowed, alpha, divisor)


# On CUDA the kernels run where HASHREC_HSTU_KERNELS=1; the default keeps the reference
# until the kernels have been timed against it in bfloat16 on a GPU (the first GPU run fed
# them float32: benchmarks/results/hstu_attention_gpu_fp32.md).
KERNELS_DEFAULT = 0


@functools.cache
def kernels_on() -> bool:
    """Whether CUDA tensors take the Triton kernels (``HASHREC_HSTU_KERNELS``, 0 or 1)."""
    # read here, not through the kernel settings' helper: importing this package (every
    # HSTU model does) must not import triton, which reads TRITON_INTERPRET once
    value = os.environ.get("HASHREC_HSTU_KERNELS", str(KERNELS_DEFAULT))
    if value not in ("0", "1"):
        raise ValueError(f"HASHREC_HSTU_KERNELS must be 0 or 1, got {value!r}")
    return value == "1"


@torch.jit.unused
def _dispatched(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor,
                alpha: float, divisor: float) -> torch.Tensor:
    if q.device.type == "cuda" and not kernels_on():
        return reference.hstu_attention(q, k, v, allowed, alpha, divisor)
    impl = backend(__name__, reference, q.device)
    return impl.hstu_attention(q, k, v, allowed, alpha, divisor)


__all__ = ["hstu_attention"]
