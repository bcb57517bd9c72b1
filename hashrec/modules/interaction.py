"""Pairwise dot-product interactions of F feature vectors (DLRM's interaction).

``PairwiseDot(F)(x)`` takes x (B, F, d) and returns (B, F * (F - 1) / 2): the dot
products <x_i, x_j> of every pair i < j, in row-major order of the upper triangle
((0, 1), (0, 2), ..., (1, 2), ...). The pair indices are a fixed buffer, so the
op has fixed shapes and no host reads (it runs inside CUDA graphs).
"""

from __future__ import annotations

import torch
from torch import nn


class PairwiseDot(nn.Module):
    """x (B, F, d) -> (B, F * (F - 1) / 2) dot products of the pairs i < j.

    Args:
        num_features: F.
    """

    def __init__(self, num_features: int) -> None:
        super().__init__()
        if num_features < 1:
            raise ValueError(f"PairwiseDot.num_features must be >= 1, got {num_features}")
        self.num_features = num_features
        pairs = torch.triu_indices(num_features, num_features, offset=1)
        self.register_buffer("rows", pairs[0], persistent=False)
        self.register_buffer("cols", pairs[1], persistent=False)

    def output_dim(self) -> int:
        return self.num_features * (self.num_features - 1) // 2

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gram = torch.bmm(x, x.transpose(1, 2))
        return gram[:, self.rows, self.cols]
