"""HSTU (hierarchical sequential transduction units) over padded sequences: the semantics of
TorchEasyRec's ``hstu_encoder`` sequence encoder, on (B, L, D) tensors of fixed shapes.

``HSTUEncoder`` scales the items by sqrt(D), adds a learned embedding of each position
(a table of ``positions = max_seq_length + max_output_len + 1`` rows), applies dropout,
zeroes the positions at or past a row's length, runs ``num_blocks`` ``HSTUBlock`` s and
divides every position by its L2 norm (at least 1e-6). A DEEP group reads the last valid
position of each row (zeros for an empty row), (B, D), in training as in evaluation
(TorchEasyRec's encoder gives that in evaluation, and every valid position, jagged, while
training, which a DEEP group cannot concatenate with its features).

One ``HSTUBlock`` (x (B, L, D) -> (B, L, D)), with layer norms without affine parameters
(eps 1e-6) and H heads::

    u, v, q, k = split(phi(layer_norm(x) @ W_uvqk))        # H*Dl, H*Dl, H*Da, H*Da wide
    a[h, n, m] = silu(<q[n, h], k[m, h]>) / positions       # where m <= n
    y = x + Linear(dropout(u * layer_norm(sum_m a[h, n, m] v[m, h])))

``phi`` is SiLU (``linear_activation: "silu"``) or the identity (``"none"``). The
attention is pointwise, not a softmax, and is divided by the fixed number of positions,
not by a row's length, so that padding a sequence further changes nothing; it is causal,
so a position reads itself and the positions before it. As in TorchEasyRec, no relative
position or time bias is added (TorchEasyRec's encoder gives its blocks no timestamps).
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional

from hashrec.modules.din import sequence_mask
from hashrec.modules.dropout import dropout
from hashrec.modules.hstu_attention import hstu_attention

LINEAR_ACTIVATIONS = ("silu", "none")


def _normalize(x: torch.Tensor, width: int) -> torch.Tensor:
    return functional.layer_norm(x, [width], eps=1e-6)


class HSTUBlock(nn.Module):
    """One HSTU layer (see the module docstring).

    Args:
        dim: width D of a position.
        attn_dim: width Da of a head's queries and keys.
        linear_dim: width Dl of a head's values and gates.
        num_heads: H.
        linear_activation: ``silu`` or ``none``, applied to the U, V, Q, K projection.
        dropout_rate: dropout on the gated attention output before the output layer.

    Shapes: x (B, L, D), allowed (L, L) bool (True where position n reads position m),
    positions (the attention's divisor) -> (B, L, D).
    """

    def __init__(self, dim: int, attn_dim: int, linear_dim: int, num_heads: int,
                 linear_activation: str = "silu", dropout_rate: float = 0.0) -> None:
        super().__init__()
        if linear_activation not in LINEAR_ACTIVATIONS:
            raise ValueError(f"linear_activation={linear_activation!r}; allowed: "
                             f"{', '.join(LINEAR_ACTIVATIONS)}")
        self.dim, self.attn_dim, self.linear_dim = dim, attn_dim, linear_dim
        self.num_heads = num_heads
        self.silu = linear_activation == "silu"
        self.dropout_rate = dropout_rate
        self.uvqk = nn.Parameter(
            torch.empty(dim, 2 * num_heads * (linear_dim + attn_dim)).normal_(0.0, 0.02))
        self.output = nn.Linear(num_heads * linear_dim, dim)
        nn.init.xavier_uniform_(self.output.weight)

    def forward(self, x: torch.Tensor, allowed: torch.Tensor, positions: float) -> torch.Tensor:
        batch, length = x.shape[0], x.shape[1]
        heads, values = self.num_heads, self.num_heads * self.linear_dim
        projected = torch.matmul(_normalize(x, self.dim), self.uvqk.to(x.dtype))
        if self.silu:
            projected = functional.silu(projected)
        u, v, q, k = torch.split(
            projected, [values, values, heads * self.attn_dim, heads * self.attn_dim], dim=-1)
        attended = hstu_attention(q.reshape(batch, length, heads, self.attn_dim),
                                  k.reshape(batch, length, heads, self.attn_dim),
                                  v.reshape(batch, length, heads, self.linear_dim), allowed,
                                  1.0, positions)
        gated = u * _normalize(attended.reshape(batch, length, values), values)
        gated = dropout(gated, self.dropout_rate, self.training)
        return x + self.output(gated)


class HSTUEncoder(nn.Module):
    """TorchEasyRec's ``hstu_encoder`` (see the module docstring): a sequence -> its last
    valid position after the HSTU blocks, L2-normalized.

    Args:
        sequence_dim: width D of a sequence item (and of the output).
        attn_dim, linear_dim, num_heads, linear_activation: of every block (``HSTUBlock``).
        max_seq_length, max_output_len: the position table holds
            ``max_seq_length + max_output_len + 1`` rows, which also divide the attention;
            a sequence may be that long at most.
        num_blocks: how many blocks run, one after the other.
        pos_dropout_rate: dropout on the items plus their position embeddings.
        linear_dropout_rate: each block's dropout before its output layer.

    Shapes: query (ignored), sequence (B, L, D), lengths (B,) -> (B, D).
    """

    def __init__(self, sequence_dim: int, attn_dim: int, linear_dim: int, max_seq_length: int,
                 num_heads: int = 4, num_blocks: int = 4, max_output_len: int = 2,
                 pos_dropout_rate: float = 0.5, linear_dropout_rate: float = 0.2,
                 linear_activation: str = "silu") -> None:
        super().__init__()
        sizes = {"sequence_dim": sequence_dim, "attn_dim": attn_dim, "linear_dim": linear_dim,
                 "max_seq_length": max_seq_length, "num_heads": num_heads,
                 "num_blocks": num_blocks}
        for name, value in sizes.items():
            if value < 1:
                raise ValueError(f"{name}={value}; it must be 1 or more")
        if max_output_len < 0:
            raise ValueError(f"max_output_len={max_output_len}; it must be 0 or more")
        for name, rate in (("pos_dropout_rate", pos_dropout_rate),
                           ("linear_dropout_rate", linear_dropout_rate)):
            if not 0.0 <= rate < 1.0:
                raise ValueError(f"{name}={rate}; it must be in [0, 1)")
        self.sequence_dim = sequence_dim
        self.positions = max_seq_length + max_output_len + 1
        self.scale = math.sqrt(sequence_dim)
        self.pos_dropout_rate = pos_dropout_rate
        self.position = nn.Embedding(self.positions, sequence_dim)
        self.blocks = nn.ModuleList([
            HSTUBlock(sequence_dim, attn_dim, linear_dim, num_heads, linear_activation,
                      linear_dropout_rate) for _ in range(num_blocks)])

    def output_dim(self) -> int:
        return self.sequence_dim

    def encode(self, sequence: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """Every position after the blocks, L2-normalized; zeros at or past a row's length:
        sequence (B, L, D), lengths (B,) -> (B, L, D)."""
        length = sequence.shape[1]
        if length > self.positions:
            raise ValueError(f"HSTUEncoder: sequences of {length} positions; the position "
                             f"table holds {self.positions} (max_seq_length + "
                             f"max_output_len + 1)")
        valid = sequence_mask(lengths, length).unsqueeze(2)
        x = sequence * self.scale + self.position.weight[:length].to(sequence.dtype)
        x = dropout(x, self.pos_dropout_rate, self.training)
        # padding reads as zeros, whatever it holds (a NaN would survive a product)
        x = x.masked_fill(~valid, 0.0)
        steps = torch.arange(length, device=sequence.device)
        # position n reads the positions m <= n: a valid position reads valid ones alone
        allowed = steps.unsqueeze(1) >= steps.unsqueeze(0)
        for block in self.blocks:
            x = block(x, allowed, float(self.positions))
        # x / max(|x|, 1e-6), with a finite gradient at 0
        x = x * torch.rsqrt((x * x).sum(dim=-1, keepdim=True).clamp(min=1e-12))
        return x.masked_fill(~valid, 0.0)

    def forward(self, query: torch.Tensor, sequence: torch.Tensor,
                lengths: torch.Tensor) -> torch.Tensor:
        encoded = self.encode(sequence, lengths)
        last = (lengths.clamp(max=encoded.shape[1]) - 1).clamp(min=0).to(torch.long)
        index = last.view(-1, 1, 1).expand(-1, 1, encoded.shape[2])
        # an empty row's position 0 is zeroed by encode: it gives zeros
        return encoded.gather(1, index).squeeze(1)
