"""WuKong's interaction layers (Zhang et al. 2024, "Wukong: Towards a Scaling Law for
Large-Scale Recommendation"): stacked factorization machines over feature rows.

A layer reads n feature rows of d columns, X (B, n, d), and writes m = fmb + lcb rows of
the same width:

- the linear compression block (``LinearCompress``) mixes the rows linearly,
  LCB(X) = W^T X with W (n, lcb): each output row is a weighted sum of the input rows;
- the factorization machine block (``FactorizationMachineBlock``, the paper's optimized
  FM) takes every pair's dot product, X X^T (B, n, n), compressed on one side to k
  columns, (X X^T) W with W (n, k), computed as X (X^T W) so that the n x n matrix is
  never formed; the n * k values are layer-normalized, go through an MLP and a linear
  layer to fmb rows of d columns;
- the layer's output is LayerNorm_d([FMB(X); LCB(X)] + R(X)), the rows concatenated FMB
  first, where the residual R is X itself when n = m and a linear compression of X to m
  rows otherwise; the LayerNorm is over each row's d columns.

Stacking layers doubles the highest interaction degree each layer (the FM's products of
products), as the paper describes.
"""

from __future__ import annotations

import torch
from torch import nn

from hashrec.modules.mlp import MLP, MLPOptions


def _check_count(name: str, value: int) -> None:
    if value < 1:
        raise ValueError(f"{name}={value}; allowed: 1 or more")


class LinearCompress(nn.Module):
    """Linear mix of feature rows: ``forward(x (B, n, d)) -> (B, m, d)``, row j of the
    output being sum_i weight[j, i] * x[:, i].

    Args:
        rows_in: n (1 or more).
        rows_out: m (1 or more).

    Raises:
        ValueError: a count below 1.
    """

    def __init__(self, rows_in: int, rows_out: int) -> None:
        super().__init__()
        _check_count("rows_in", rows_in)
        _check_count("rows_out", rows_out)
        # (out, in) as nn.Linear's weight, so that Kaiming's fan is the rows mixed
        self.weight = nn.Parameter(torch.empty(rows_out, rows_in))
        nn.init.kaiming_uniform_(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.matmul(self.weight, x)


class FactorizationMachineBlock(nn.Module):
    """WuKong's optimized FM: ``forward(x (B, n, d)) -> (B, rows_out, d)`` (see the module
    docstring).

    Args:
        dim: d, the rows' width.
        rows_in: n.
        rows_out: the rows it writes (the config's ``fmb_feature_num``).
        compressed: k, the columns the pairwise dot products are compressed to
            (``compressed_feature_num``).
        mlp: the MLP over the n * k normalized values (``feature_num_mlp``).

    Raises:
        ValueError: a count below 1.
    """

    def __init__(self, dim: int, rows_in: int, rows_out: int, compressed: int,
                 mlp: MLPOptions) -> None:
        super().__init__()
        for name, value in (("dim", dim), ("rows_in", rows_in), ("rows_out", rows_out),
                            ("compressed_feature_num", compressed)):
            _check_count(name, value)
        self.rows_out = rows_out
        self.dim = dim
        self.compress = nn.Parameter(torch.empty(rows_in, compressed))
        nn.init.kaiming_uniform_(self.compress)
        self.norm = nn.LayerNorm(rows_in * compressed)
        self.mlp = MLP(rows_in * compressed, mlp)
        self.project = nn.Linear(self.mlp.output_dim(), rows_out * dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # X (X^T W): (B, n, k) without the (B, n, n) matrix of every pair
        compressed = torch.matmul(x, torch.matmul(x.transpose(1, 2), self.compress))
        hidden = self.mlp(self.norm(compressed.flatten(1)))
        return self.project(hidden).reshape(x.shape[0], self.rows_out, self.dim)


class WuKongLayer(nn.Module):
    """One WuKong layer: ``forward(x (B, rows_in, dim)) -> (B, fmb_rows + lcb_rows, dim)``
    (see the module docstring).

    Args:
        dim: d, the rows' width.
        rows_in: n.
        lcb_rows: rows of the linear compression block (``lcb_feature_num``).
        fmb_rows: rows of the factorization machine block (``fmb_feature_num``).
        compressed: the FM block's k (``compressed_feature_num``).
        mlp: the FM block's MLP (``feature_num_mlp``).

    Raises:
        ValueError: a count below 1.
    """

    def __init__(self, dim: int, rows_in: int, lcb_rows: int, fmb_rows: int,
                 compressed: int, mlp: MLPOptions) -> None:
        super().__init__()
        _check_count("lcb_feature_num", lcb_rows)
        _check_count("fmb_feature_num", fmb_rows)
        self.lcb = LinearCompress(rows_in, lcb_rows)
        self.fmb = FactorizationMachineBlock(dim, rows_in, fmb_rows, compressed, mlp)
        rows_out = lcb_rows + fmb_rows
        self.residual = (nn.Identity() if rows_in == rows_out
                         else LinearCompress(rows_in, rows_out))
        self.norm = nn.LayerNorm(dim)
        self._rows_out = rows_out

    def output_rows(self) -> int:
        """fmb_rows + lcb_rows."""
        return self._rows_out

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        rows = torch.cat([self.fmb(x), self.lcb(x)], dim=1)
        return self.norm(rows + self.residual(x))
