"""HSTU's pointwise attention in PyTorch (the CPU path and the kernels' oracle)."""

from __future__ import annotations

import torch
from torch.nn import functional


def hstu_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                   allowed: torch.Tensor, alpha: float, divisor: float) -> torch.Tensor:
    """Each position's values read through SiLU weights (no softmax):
    out[b, n, h] = sum_m silu(alpha <q[b, n, h], k[b, m, h]>) / divisor * allowed[b, n, m]
    * v[b, m, h].

    Args:
        q, k: (B, L, H, A) queries and keys.
        v: (B, L, H, Dv) values.
        allowed: (B, L, L) bool, [b, n, m] True where position n reads position m, or
            (L, L) for every row alike.
        alpha: the scores' factor (1.0 leaves them as they are).
        divisor: the weights' divisor.

    Returns:
        (B, L, H, Dv), in the dtype ``einsum`` gives (under autocast, its compute type).
    """
    scores = torch.einsum("bnha,bmha->bhnm", q, k)
    if alpha != 1.0:
        scores = scores * alpha
    mask = allowed.to(scores.dtype)
    weights = functional.silu(scores) / divisor * (mask if mask.dim() == 2
                                                   else mask.unsqueeze(1))
    return torch.einsum("bhnm,bmhd->bnhd", weights, v)
