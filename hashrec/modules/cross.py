"""Cross networks of DCN v1 and DCN v2: explicit, bounded-degree feature crosses.

Both keep the input x_0 (B, D) and update x_l, l = 0 .. cross_num - 1, residually, so
that layer l holds crosses of degree up to l + 2 of the input's columns:

- ``Cross`` (DCN v1, Wang et al. 2017): x_{l+1} = x_0 * (x_l . w_l) + b_l + x_l, with
  a weight vector w_l (D,) (a scalar per row scales x_0) and a bias b_l (D,);
- ``CrossV2`` (DCN v2, Wang et al. 2021): x_{l+1} = x_0 * (V_l (U_l x_l) + b_l) + x_l,
  where V_l U_l (D x r times r x D) factors the full D x D matrix at rank r
  (``low_rank``).

The output is x_{cross_num} (B, D).
"""

from __future__ import annotations

import torch
from torch import nn


def _check_layers(cross_num: int) -> None:
    if cross_num < 1:
        raise ValueError(f"cross_num={cross_num}; allowed: 1 or more cross layers")


class Cross(nn.Module):
    """DCN v1's cross network: ``forward(x (B, D)) -> (B, D)``.

    Args:
        input_dim: D (1 or more).
        cross_num: number of cross layers (1 or more).

    Raises:
        ValueError: input_dim or cross_num below 1.
    """

    def __init__(self, input_dim: int, cross_num: int = 3) -> None:
        super().__init__()
        if input_dim < 1:
            raise ValueError(f"Cross input_dim must be > 0, got {input_dim}")
        _check_layers(cross_num)
        self.weights = nn.ModuleList([nn.Linear(input_dim, 1, bias=False)
                                      for _ in range(cross_num)])
        self.biases = nn.ParameterList([nn.Parameter(torch.zeros(input_dim))
                                        for _ in range(cross_num)])
        for layer in self.weights:
            nn.init.xavier_uniform_(layer.weight)
        self._output_dim = input_dim

    def output_dim(self) -> int:
        """D: the cross network keeps its input's width."""
        return self._output_dim

    def forward(self, x: torch.Tensor, start: torch.Tensor | None = None) -> torch.Tensor:
        """x_0 = ``x``; the layers update x_l from ``start`` (default ``x``): a backbone's
        recurrent block passes the previous step's output there."""
        out = x if start is None else start
        for layer, bias in zip(self.weights, self.biases):
            out = x * layer(out) + bias + out
        return out


class CrossV2(nn.Module):
    """DCN v2's low-rank cross network: ``forward(x (B, D)) -> (B, D)``.

    Args:
        input_dim: D (1 or more).
        cross_num: number of cross layers (1 or more).
        low_rank: r, the rank of each layer's matrix (1 or more).

    Raises:
        ValueError: input_dim, cross_num or low_rank below 1.
    """

    def __init__(self, input_dim: int, cross_num: int = 3, low_rank: int = 32) -> None:
        super().__init__()
        if input_dim < 1:
            raise ValueError(f"CrossV2 input_dim must be > 0, got {input_dim}")
        _check_layers(cross_num)
        if low_rank < 1:
            raise ValueError(f"low_rank={low_rank}; allowed: 1 or more")
        self.down = nn.ModuleList([nn.Linear(input_dim, low_rank, bias=False)
                                   for _ in range(cross_num)])
        self.up = nn.ModuleList([nn.Linear(low_rank, input_dim) for _ in range(cross_num)])
        self._output_dim = input_dim

    def output_dim(self) -> int:
        """D: the cross network keeps its input's width."""
        return self._output_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = x
        for down, up in zip(self.down, self.up):
            out = x * up(down(out)) + out
        return out
