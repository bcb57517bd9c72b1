"""Encoders that reduce a behaviour sequence to one vector a row, besides DIN attention
(``hashrec.modules.din``): the semantics of TorchEasyRec's sequence encoders of the same
names.

Every encoder takes ``query (B, Dq), sequence (B, L, Ds), lengths (B,)`` and returns
(B, ``output_dim()``); positions at or past a row's length are masked out. All shapes are
fixed by the inputs' (no host reads), so they run inside a CUDA graph.

* ``SimpleAttention``: scores ``s_t = <k_t, q>`` (Dq must equal Ds), softmax over the
  valid positions, output ``sum_t w_t k_t``; an empty row gives zeros.
* ``SequencePooling``: the sum of the valid positions, or their mean (divided by the
  length, at least 1); the query is not read.
* ``MultiWindowDIN``: the query zero-padded to Ds; an MLP over ``[k_t, q * k_t, q]``, a
  linear layer to one score and a PReLU give ``a_t``; the positions are cut into
  consecutive windows of ``windows_len`` positions (positions past their sum are left
  out) and each window gives ``sum_t a_t k_t`` over its valid positions divided by their
  count (at least 1); output ``[window_1, ..., window_W, q]``, (B, (W + 1) Ds).
"""

from __future__ import annotations

import torch
from torch import nn

from hashrec.modules.din import lowest_value, sequence_mask
from hashrec.modules.mlp import MLP, MLPOptions

POOLING_TYPES = ("sum", "mean")


class SimpleAttention(nn.Module):
    """Dot-product attention of the query over the sequence (see the module docstring).

    Shapes: query (B, D), sequence (B, L, D), lengths (B,) -> (B, D).
    """

    def __init__(self, query_dim: int, sequence_dim: int) -> None:
        super().__init__()
        if query_dim != sequence_dim:
            raise ValueError(f"SimpleAttention needs a query as wide as a sequence item: "
                             f"query_dim={query_dim}, sequence_dim={sequence_dim}")
        self.sequence_dim = sequence_dim

    def output_dim(self) -> int:
        return self.sequence_dim

    def forward(self, query: torch.Tensor, sequence: torch.Tensor,
                lengths: torch.Tensor) -> torch.Tensor:
        mask = sequence_mask(lengths, sequence.shape[1])
        scores = torch.bmm(sequence, query.unsqueeze(2).to(sequence.dtype)).squeeze(2)
        scores = scores.masked_fill(~mask, lowest_value(scores.dtype))
        weights = torch.softmax(scores, dim=-1) * mask.to(scores.dtype)
        return torch.bmm(weights.unsqueeze(1), sequence).squeeze(1)


class SequencePooling(nn.Module):
    """Sum or mean of a sequence's valid positions (see the module docstring).

    Shapes: query (ignored), sequence (B, L, D), lengths (B,) -> (B, D).
    """

    def __init__(self, sequence_dim: int, pooling_type: str = "mean") -> None:
        super().__init__()
        if pooling_type not in POOLING_TYPES:
            raise ValueError(f"SequencePooling pooling_type={pooling_type!r}; allowed: "
                             f"{', '.join(POOLING_TYPES)}")
        self.sequence_dim = sequence_dim
        self.mean = pooling_type == "mean"

    def output_dim(self) -> int:
        return self.sequence_dim

    def forward(self, query: torch.Tensor, sequence: torch.Tensor,
                lengths: torch.Tensor) -> torch.Tensor:
        mask = sequence_mask(lengths, sequence.shape[1]).to(sequence.dtype)
        pooled = (sequence * mask.unsqueeze(2)).sum(dim=1)
        if self.mean:
            pooled = pooled / lengths.clamp(min=1).unsqueeze(1).to(pooled.dtype)
        return pooled


class MultiWindowDIN(nn.Module):
    """Attention-weighted means over consecutive windows of positions, and the query (see
    the module docstring).

    Args:
        query_dim: width of the query, at most ``sequence_dim`` (zero-padded to it).
        sequence_dim: width of a sequence item.
        windows_len: the windows' lengths in positions, from the first position on.
        attn_mlp: options of the attention MLP (its input is 3 * sequence_dim).

    Shapes: query (B, Dq), sequence (B, L, Ds), lengths (B,) -> (B, (W + 1) Ds).
    """

    def __init__(self, query_dim: int, sequence_dim: int, windows_len: tuple[int, ...],
                 attn_mlp: MLPOptions) -> None:
        super().__init__()
        if not 0 < query_dim <= sequence_dim:
            raise ValueError(f"MultiWindowDIN query_dim={query_dim} must be in [1, "
                             f"sequence_dim={sequence_dim}]: the query is multiplied with "
                             f"each sequence item")
        if not windows_len or min(windows_len) < 1:
            raise ValueError(f"MultiWindowDIN windows_len={list(windows_len)}; give one or "
                             f"more lengths, each 1 or more")
        self.query_dim = query_dim
        self.sequence_dim = sequence_dim
        self.span = sum(windows_len)
        starts = torch.tensor([0, *windows_len[:-1]]).cumsum(0)
        positions = torch.arange(self.span)
        # windows (W, span): 1 where the position lies in the window
        self.register_buffer("windows", ((positions >= starts.unsqueeze(1))
                                         & (positions < (starts + torch.tensor(windows_len))
                                            .unsqueeze(1))).float(), persistent=False)
        self.register_buffer("starts", starts, persistent=False)
        self.register_buffer("sizes", torch.tensor(windows_len), persistent=False)
        self.mlp = MLP(3 * sequence_dim, attn_mlp)
        self.score = nn.Linear(self.mlp.output_dim(), 1)
        self.activation = nn.PReLU()

    def output_dim(self) -> int:
        return self.sequence_dim * (self.windows.shape[0] + 1)

    def forward(self, query: torch.Tensor, sequence: torch.Tensor,
                lengths: torch.Tensor) -> torch.Tensor:
        if self.query_dim < self.sequence_dim:
            query = nn.functional.pad(query, [0, self.sequence_dim - self.query_dim])
        query = query.to(sequence.dtype)
        queries = query.unsqueeze(1).expand(-1, sequence.shape[1], -1)
        scores = self.activation(self.score(self.mlp(
            torch.cat([sequence, queries * sequence, queries], dim=-1))))
        mask = sequence_mask(lengths, sequence.shape[1]).to(scores.dtype).unsqueeze(2)
        weighted = scores * mask * sequence
        # pad with zeros, or cut, to the windows' span of positions
        weighted = nn.functional.pad(weighted, [0, 0, 0, self.span - sequence.shape[1]])
        sums = torch.matmul(self.windows.to(weighted.dtype), weighted)  # (B, W, Ds)
        counts = torch.minimum(lengths.unsqueeze(1) - self.starts.unsqueeze(0),
                               self.sizes.unsqueeze(0)).clamp(min=1)
        means = sums / counts.unsqueeze(2).to(sums.dtype)
        return torch.cat([means, query.unsqueeze(1)], dim=1).flatten(1)
