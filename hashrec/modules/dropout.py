"""Dropout whose CPU masks come from 16-bit random draws.

On the CPU torch's dropout draws its mask with ``bernoulli_``, one float draw a value, which
is slow (2 cores, 7.7M values: 46 ms, ``rand`` 25 ms). Here one 64-bit draw gives four
16-bit lanes, a value kept where its lane is at least ``p`` of the way up the lane's range
(7.9 ms for the same values), so ``p`` is taken to the nearest 1/65536; the kept values are
scaled by 1 / (1 - p) as torch's are. The draws come from torch's CPU generator (one seed,
one mask). A scripted module draws ``rand`` instead (TorchScript has no dtype views); the
exported models run in eval, without dropout. On CUDA torch's fused kernel stays (a
captured graph draws new masks there at every replay), as on any device but the CPU.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional


def dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    """``x`` with each value zeroed with probability ``p`` and the others scaled by
    1 / (1 - p) in training; ``x`` itself otherwise. Shapes: any -> the same."""
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p >= 1.0:
        return functional.dropout(x, p, True)
    if torch.jit.is_scripting():
        kept = torch.rand_like(x) >= p  # TorchScript has no dtype views
    else:
        kept = _kept_by_lanes(x, p)
    return x * kept.to(x.dtype).mul_(1.0 / (1.0 - p))


@torch.jit.unused
def _kept_by_lanes(x: torch.Tensor, p: float) -> torch.Tensor:
    """(x's shape) bool: True with probability 1 - p (to the nearest 1/65536)."""
    n = x.numel()
    # every 64-bit value (the upper bound is excluded): four 16-bit lanes of any value
    bits = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(2 ** 63), 2 ** 63 - 1)
    lanes = bits.view(torch.int16)[:n].view(x.shape)
    return lanes >= round(p * 65536.0) - 32768


class Dropout(nn.Dropout):
    """``nn.Dropout`` with the CPU masks above (``inplace`` is not taken)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)
