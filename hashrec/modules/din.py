"""DIN target attention over a behaviour sequence.

For each position ``t`` of the sequence ``k_t`` and the target ``q`` (the
candidate item's features), an attention MLP reads ``[q, k_t, q - k_t, q * k_t]``
and a final linear layer gives a score ``s_t``. Positions at or beyond the
row's sequence length are masked out. The weights are then

* ``softmax`` (default, as in TorchEasyRec): ``w = softmax(s)`` over the valid
  positions, so the output is a convex combination of the behaviours;
* ``none`` (the DIN paper): ``w = s`` on valid positions, unnormalized, which
  keeps the intensity of the user's interest in the output's magnitude.

A row with an empty sequence gets a zero vector.

Off CUDA the attention MLP runs on the valid positions alone, packed: a behaviour
sequence is mostly padding (the generated Taobao data's histories average 10 of 50
positions, and there the attention's forward and backward took 6.7x less time on two CPU
cores, ``benchmarks/results/din_cpu.md``). Each position's score depends on that
position alone, so this changes nothing but the time, unless the MLP normalizes over the
batch (``use_bn``, ``nn.Dice``), whose statistics the padded positions are part of: such
an MLP runs padded everywhere. On CUDA it runs padded, at the fixed shapes a CUDA graph
needs.

The query is zero-padded up to the sequence width when it is narrower (a group
may list fewer query features than sequence features); a wider query is an error.
"""

from __future__ import annotations

import torch
from torch import nn

from hashrec.modules.activation import canonical_activation
from hashrec.modules.mlp import MLP, MLPOptions

NORMALIZERS = ("softmax", "none")


def lowest_value(dtype: torch.dtype) -> float:
    """``torch.finfo(dtype).min`` of a floating dtype, written so that TorchScript compiles it."""
    if dtype == torch.float16:
        return -65504.0
    if dtype == torch.bfloat16:
        return -3.3895313892515355e38
    if dtype == torch.float64:
        return -1.7976931348623157e308
    return -3.4028234663852886e38


def sequence_mask(lengths: torch.Tensor, max_length: int) -> torch.Tensor:
    """lengths (B,) -> (B, max_length) bool, True where the position holds an element."""
    positions = torch.arange(max_length, device=lengths.device)
    return positions.unsqueeze(0) < lengths.unsqueeze(1)


class DINAttention(nn.Module):
    """Target attention pooling of a sequence.

    Args:
        query_dim: width of the query (B, query_dim).
        sequence_dim: width of each sequence element (B, L, sequence_dim).
        attn_mlp: options of the attention MLP (its input is 4 * sequence_dim).
        normalizer: ``softmax`` or ``none`` (see the module docstring).

    Shapes: query (B, Dq), sequence (B, L, Ds), lengths (B,) -> (B, Ds).
    """

    def __init__(self, query_dim: int, sequence_dim: int, attn_mlp: MLPOptions,
                 normalizer: str = "softmax") -> None:
        super().__init__()
        if sequence_dim <= 0:
            raise ValueError(f"DINAttention sequence_dim must be > 0, got {sequence_dim}")
        if not 0 < query_dim <= sequence_dim:
            raise ValueError(
                f"DINAttention query_dim={query_dim} must be in [1, sequence_dim="
                f"{sequence_dim}]: the query is compared element-wise with each sequence item")
        if normalizer not in NORMALIZERS:
            raise ValueError(
                f"DINAttention normalizer={normalizer!r}; allowed: {', '.join(NORMALIZERS)}")
        self.query_dim = query_dim
        self.sequence_dim = sequence_dim
        self.normalizer = normalizer
        self.mlp = MLP(4 * sequence_dim, attn_mlp)
        self.score = nn.Linear(self.mlp.output_dim(), 1)
        # Off CUDA, score the valid positions alone (see the module docstring).
        self.packs = not attn_mlp.use_bn and canonical_activation(attn_mlp.activation) != "Dice"

    def output_dim(self) -> int:
        return self.sequence_dim

    def _first_layer_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """The first linear layer's weight W = [W1 W2 W3 W4] over [q, k, q - k, q * k],
        factored: (W1 + W3) for q, [W2 - W3, W4] for [k, q * k]."""
        d = self.sequence_dim
        w = self.mlp.first_weight()
        w_query = w[:, :d] + w[:, 2 * d:3 * d]
        return w_query, torch.cat([w[:, d:2 * d] - w[:, 2 * d:3 * d], w[:, 3 * d:]], 1)

    def _first_layer(self, query: torch.Tensor, sequence: torch.Tensor) -> torch.Tensor:
        """The attention MLP's first linear layer on [q, k, q - k, q * k], factored.

        W [q, k, q - k, q * k] equals (W1 + W3) q + (W2 - W3) k + W4 (q * k): the query
        term is computed once per row instead of once per position, and the (B, L, 4 D)
        input is never built.
        """
        w_query, w_item = self._first_layer_weights()
        per_row = nn.functional.linear(query, w_query, self.mlp.first_bias())
        items = torch.cat([sequence, query.unsqueeze(1) * sequence], -1)
        return nn.functional.linear(items, w_item) + per_row.unsqueeze(1)

    def _scores(self, query: torch.Tensor, sequence: torch.Tensor) -> torch.Tensor:
        """Scores (B, L) of every position, padded ones included."""
        return self.score(self.mlp.after_first_linear(
            self._first_layer(query, sequence))).squeeze(-1)

    def _packed_scores(self, query: torch.Tensor, sequence: torch.Tensor,
                       mask: torch.Tensor) -> torch.Tensor:
        """Scores (B, L) of the valid positions, computed on those alone; the padded ones
        hold 0 (``attention_weights`` masks them either way)."""
        batch, max_length = mask.shape
        at = torch.nonzero(mask.reshape(-1)).squeeze(1)
        rows = torch.div(at, max_length, rounding_mode="floor")
        items = sequence.reshape(batch * max_length, sequence.shape[2]).index_select(0, at)
        w_query, w_item = self._first_layer_weights()
        per_row = nn.functional.linear(query, w_query, self.mlp.first_bias())
        query_at = query.index_select(0, rows)
        first = (nn.functional.linear(torch.cat([items, query_at * items], -1), w_item)
                 + per_row.index_select(0, rows))
        packed = self.score(self.mlp.after_first_linear(first)).squeeze(-1)
        scores = packed.new_zeros(batch * max_length)
        return scores.index_copy(0, at, packed).view(batch, max_length)

    def attention_weights(self, query: torch.Tensor, sequence: torch.Tensor,
                          lengths: torch.Tensor) -> torch.Tensor:
        """Masked attention weights (B, L); zero on padded positions."""
        if self.query_dim < self.sequence_dim:
            query = nn.functional.pad(query, (0, self.sequence_dim - self.query_dim))
        mask = sequence_mask(lengths, sequence.shape[1])
        if self.packs and not sequence.is_cuda:
            scores = self._packed_scores(query, sequence, mask)
        else:
            scores = self._scores(query, sequence)
        if self.normalizer == "softmax":
            scores = scores.masked_fill(~mask, lowest_value(scores.dtype))
            weights = torch.softmax(scores, dim=-1)
        else:
            weights = scores
        return weights * mask.to(weights.dtype)

    def forward(self, query: torch.Tensor, sequence: torch.Tensor,
                lengths: torch.Tensor) -> torch.Tensor:
        weights = self.attention_weights(query, sequence, lengths)
        return torch.bmm(weights.unsqueeze(1).to(sequence.dtype), sequence).squeeze(1)
