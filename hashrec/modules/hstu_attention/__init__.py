"""HSTU's pointwise attention, ``hstu_attention``, dispatched by device.

    out[b, n, h] = sum over m of silu(alpha <q[b, n, h], k[b, m, h]>) / divisor
                   * allowed[b, n, m] * v[b, m, h]

``reference.py`` is the CPU path and the kernels' oracle: it builds the (B, H, L, L)
weights in memory. ``triton.py`` (CUDA) computes them tile by tile in registers, forward
and backward, and stores none of them. Shapes and arguments: ``reference.hstu_attention``.
"""

from __future__ import annotations

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


@torch.jit.unused
def _dispatched(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, allowed: torch.Tensor,
                alpha: float, divisor: float) -> torch.Tensor:
    impl = backend(__name__, reference, q.device)
    return impl.hstu_attention(q, k, v, allowed, alpha, divisor)


__all__ = ["hstu_attention"]
