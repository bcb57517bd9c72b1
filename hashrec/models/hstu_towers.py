"""HSTU match's towers (``hashrec.models.hstu_match``), shared by the model and its exported
TorchScript form, so that the two cannot drift apart.

No ``from __future__ import annotations`` here: TorchScript reads these annotations as
types.
"""

import torch
from torch import nn

from hashrec.modules.din import sequence_mask
from hashrec.modules.dropout import dropout
from hashrec.modules.stu import stu_mask


def reverse_prefixes(values: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
    """Each row's first ``lengths`` positions in reverse order, the padding after them
    kept: values (B, L, ...) -> (B, L, ...) (a history stored newest first, turned
    oldest first)."""
    length = values.shape[1]
    steps = torch.arange(length, device=values.device).unsqueeze(0)
    lengths = lengths.clamp(max=length).unsqueeze(1).to(steps.dtype)
    index = torch.where(steps < lengths, lengths - 1 - steps, steps)
    if values.dim() == 3:
        index = index.unsqueeze(-1).expand(-1, -1, values.shape[2])
    return values.gather(1, index)


class HSTUUserTower(nn.Module):
    """The user tower: a history (B, L, Du) and its lengths (B,), the contextual features
    (B, C * Dc) (0 wide without), each position's actions, watch times and timestamps
    (B, L) (zeros where unread) -> (B, D) users.

    Histories stored newest first (``ascending`` false) are reversed first; then the UIH
    preprocessor (contextual tokens before the history), the positional encoder, dropout,
    the STU layers (positions at or past a row's length zeroed after each), the output
    postprocessor; the user is the row's last position (zeros for a row without one),
    then a linear layer to ``output_dim`` where set, L2-normalized under COSINE.
    """

    ascending: bool
    contextual: int
    max_attn_len: int
    input_dropout: float
    cosine: bool

    def __init__(self, preprocessor: nn.Module, positional: nn.Module, layers: nn.ModuleList,
                 postprocessor: nn.Module, output: nn.Module, input_dropout: float,
                 contextual: int, max_attn_len: int, cosine: bool, ascending: bool,
                 dim: int) -> None:
        super().__init__()
        self.preprocessor = preprocessor
        self.positional = positional
        self.layers = layers
        self.postprocessor = postprocessor
        self.output = output
        self.input_dropout = input_dropout
        self.contextual = contextual
        self.max_attn_len = max_attn_len
        self.cosine = cosine
        self.ascending = ascending
        self.dim = dim

    def encode(self, history: torch.Tensor, lengths: torch.Tensor, contextual: torch.Tensor,
               actions: torch.Tensor, watchtimes: torch.Tensor, timestamps: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """Every position after the postprocessor (B, C + L, D) and the rows' lengths
        (contextual tokens included)."""
        if not self.ascending:
            history = reverse_prefixes(history, lengths)
            actions = reverse_prefixes(actions, lengths)
            watchtimes = reverse_prefixes(watchtimes, lengths)
            timestamps = reverse_prefixes(timestamps, lengths)
        x, lengths, timestamps = self.preprocessor(history, lengths, contextual,
                                                   actions.long(), watchtimes, timestamps)
        x = self.positional(x, lengths, timestamps)
        x = dropout(x, self.input_dropout, self.training)
        length = x.shape[1]
        invalid = torch.logical_not(sequence_mask(lengths, length)).unsqueeze(-1)
        # padding reads as zeros, whatever it holds (a NaN would survive a product)
        x = x.masked_fill(invalid, 0.0)
        allowed = stu_mask(lengths, length, self.contextual, self.max_attn_len)
        for layer in self.layers:
            x = layer(x, allowed).masked_fill(invalid, 0.0)
        return self.postprocessor(x, timestamps).masked_fill(invalid, 0.0), lengths

    def forward(self, history: torch.Tensor, lengths: torch.Tensor, contextual: torch.Tensor,
                actions: torch.Tensor, watchtimes: torch.Tensor, timestamps: torch.Tensor
                ) -> torch.Tensor:
        encoded, lengths = self.encode(history, lengths, contextual, actions, watchtimes,
                                       timestamps)
        last = (lengths - 1).clamp(min=0).to(torch.long)
        index = last.view(-1, 1, 1).expand(-1, 1, encoded.shape[2])
        # a row without a position reads its position 0, zeroed by encode: zeros
        user = self.output(encoded.gather(1, index).squeeze(1))
        if self.cosine:
            user = nn.functional.normalize(user, p=2.0, dim=-1, eps=1e-6)
        return user


class HSTUItemTower(nn.Module):
    """The item tower: items (..., Dc) -> the MLP (or none) -> a linear layer to
    ``output_dim`` (or none) -> (..., D), L2-normalized under COSINE."""

    cosine: bool

    def __init__(self, mlp: nn.Module, output: nn.Module, cosine: bool, dim: int) -> None:
        super().__init__()
        self.mlp = mlp
        self.output = output
        self.cosine = cosine
        self.dim = dim

    def forward(self, items: torch.Tensor) -> torch.Tensor:
        out = self.output(self.mlp(items))
        if self.cosine:
            out = nn.functional.normalize(out, p=2.0, dim=-1, eps=1e-6)
        return out


def candidate_similarity(user: torch.Tensor, positives: torch.Tensor,
                         negatives: torch.Tensor, hard: torch.Tensor,
                         has_hard: bool) -> torch.Tensor:
    """Every positive of a row against the row's user, then the user against the
    negatives: users (B, D), positives (B, K, D), negatives (N [+ B * H], D) (shared
    negatives, then each row's H hard-negative slots, ``hard`` (B, H) telling the filled
    ones) -> (B * K, 1 + N [+ H]), row b * K + j: positive j of row b (column 0), then the
    negatives (-inf in a row's empty hard slots)."""
    rows, count = positives.shape[0], positives.shape[1]
    positive = (user.unsqueeze(1) * positives).sum(dim=-1)
    shared = negatives
    own = torch.empty(0, device=user.device, dtype=user.dtype)
    if has_hard:
        slots = hard.shape[1]
        shared = negatives[:negatives.shape[0] - rows * slots]
        own = (user.unsqueeze(1) * negatives[shared.shape[0]:].reshape(rows, slots, -1)) \
            .sum(dim=-1).masked_fill(torch.logical_not(hard), float("-inf"))
    negative = user @ shared.t()
    if has_hard:
        negative = torch.cat([negative, own], dim=-1)
    columns = negative.shape[1]
    return torch.cat([positive.unsqueeze(-1),
                      negative.unsqueeze(1).expand(rows, count, columns)],
                     dim=-1).reshape(rows * count, 1 + columns)
