"""Dropout whose CPU masks come from uniform draws.

On the CPU torch's dropout draws its mask with ``bernoulli_``, which takes about three times
as long as ``rand`` of the same size (2 cores, 2.9M values: 28 against 9 ms): a value kept
where its uniform draw is at least ``p`` is kept with the same probability, 1 - p, so the
CPU path draws that way, from the same generator (one seed, one mask). On CUDA torch's
fused kernel stays (a captured graph draws new masks there at every replay).
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
    if x.is_cuda or p >= 1.0:
        return functional.dropout(x, p, True)
    keep = (torch.rand_like(x) >= p).to(x.dtype).mul_(1.0 / (1.0 - p))
    return x * keep


class Dropout(nn.Dropout):
    """``nn.Dropout`` with the CPU masks above (``inplace`` is not taken)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return dropout(x, self.p, self.training)
