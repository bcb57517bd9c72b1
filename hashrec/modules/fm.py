"""Factorization machine: the pairwise interactions of N feature embeddings.

``FactorizationMachine()(x)`` takes x (B, N, d) and returns (B, d): the sum over
pairs i < j of the elementwise products x_i * x_j, computed in O(N d) as
((sum_i x_i)^2 - sum_i x_i^2) / 2. Summed over d it is the second-order term of
a factorization machine (DeepFM's FM logit).
"""

from __future__ import annotations

import torch
from torch import nn


class FactorizationMachine(nn.Module):
    """x (B, N, d) -> (B, d) pairwise interactions; no parameters."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        total = x.sum(dim=1)
        return 0.5 * (total * total - (x * x).sum(dim=1))

