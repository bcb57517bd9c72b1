"""The dense network of dlrm_hstu (``hashrec.models.dlrm_hstu``), shared by the model and
its exported TorchScript form, so that the two cannot drift apart.

No ``from __future__ import annotations`` here: TorchScript reads these annotations as
types.
"""

import torch
from torch import nn

from hashrec.models.hstu_towers import reverse_prefixes
from hashrec.modules.din import sequence_mask
from hashrec.modules.dropout import dropout
from hashrec.modules.hstu_inputs import SwishLayerNorm
from hashrec.modules.stu import stu_mask


def xavier_linears(module: nn.Module) -> nn.Module:
    """Every linear layer of ``module`` with xavier weights and zero biases (TorchEasyRec's
    initialization of dlrm_hstu's item MLP and fusion tower)."""
    for layer in module.modules():
        if isinstance(layer, nn.Linear):
            nn.init.xavier_uniform_(layer.weight)
            if layer.bias is not None:
                nn.init.zeros_(layer.bias)
    return module


def item_mlp(input_dim: int, hidden_dim: int, output_dim: int) -> nn.Module:
    """Each candidate's embedding (Dt) -> Linear(Dt, H), x * sigmoid(LayerNorm(x)),
    Linear(H, D), LayerNorm(D)."""
    return xavier_linears(nn.Sequential(nn.Linear(input_dim, hidden_dim),
                                        SwishLayerNorm(hidden_dim),
                                        nn.Linear(hidden_dim, output_dim),
                                        nn.LayerNorm(output_dim, eps=1e-5)))


class FusionTower(nn.Module):
    """TorchEasyRec's FusionMTLTower: user (..., D) * item (..., D) through the MLP (or
    none), then one linear layer to every task's logits side by side (..., T)."""

    def __init__(self, mlp: nn.Module, width: int, logits: int) -> None:
        super().__init__()
        self.mlp = mlp
        self.linear = nn.Linear(width, logits)
        xavier_linears(self)

    def forward(self, user: torch.Tensor, item: torch.Tensor) -> torch.Tensor:
        return self.linear(self.mlp(user * item))


class DlrmHSTUNet(nn.Module):
    """dlrm_hstu's network: a row's history and candidates -> each candidate's logits.

    Inputs: history (B, L, Du), lengths (B,), contextual (B, C * Dx) ((B, 0) without),
    actions, watch times, timestamps (B, L) (zeros where unread), candidates (B, K, Dt),
    candidate counts (B,), candidate timestamps (B, K). Histories stored newest first
    (``ascending`` false) are reversed first; then the preprocessor (contextual tokens,
    history, candidates), the positional encoder, dropout, the STU layers (each candidate
    reading the contextual tokens, the history and itself; positions past a row's length
    zeroed after each layer), each candidate's output through the postprocessor (with its
    timestamp), times its item embedding (``item_mlp``) through the fusion tower
    -> (B, K, T) logits (a row's slots past its candidates hold padding's).
    """

    ascending: bool
    contextual: int
    max_attn_len: int
    input_dropout: float

    def __init__(self, preprocessor: nn.Module, positional: nn.Module, layers: nn.ModuleList,
                 postprocessor: nn.Module, items: nn.Module, fusion: nn.Module,
                 input_dropout: float, contextual: int, max_attn_len: int,
                 ascending: bool) -> None:
        super().__init__()
        self.preprocessor = preprocessor
        self.positional = positional
        self.layers = layers
        self.postprocessor = postprocessor
        self.items = items
        self.fusion = fusion
        self.input_dropout = input_dropout
        self.contextual = contextual
        self.max_attn_len = max_attn_len
        self.ascending = ascending

    def users(self, history: torch.Tensor, lengths: torch.Tensor, contextual: torch.Tensor,
              actions: torch.Tensor, watchtimes: torch.Tensor, timestamps: torch.Tensor,
              candidates: torch.Tensor, counts: torch.Tensor,
              candidate_timestamps: torch.Tensor) -> torch.Tensor:
        """Each candidate's output of the STU layers after the postprocessor (B, K, D)."""
        if not self.ascending:
            history = reverse_prefixes(history, lengths)
            actions = reverse_prefixes(actions, lengths)
            watchtimes = reverse_prefixes(watchtimes, lengths)
            timestamps = reverse_prefixes(timestamps, lengths)
        x, total, times, num_targets, position = self.preprocessor(
            history, lengths, candidates, counts, contextual, actions.long(), watchtimes,
            timestamps, candidate_timestamps)
        x = self.positional(x, total, times, num_targets)
        x = dropout(x, self.input_dropout, self.training)
        length = x.shape[1]
        invalid = torch.logical_not(sequence_mask(total, length)).unsqueeze(-1)
        # padding reads as zeros, whatever it holds (a NaN would survive a product)
        x = x.masked_fill(invalid, 0.0)
        allowed = stu_mask(total, length, self.contextual, self.max_attn_len, num_targets)
        for layer in self.layers:
            x = layer(x, allowed).masked_fill(invalid, 0.0)
        position = position.clamp(max=length - 1)
        out = x.gather(1, position.unsqueeze(-1).expand(-1, -1, x.shape[2]))
        return self.postprocessor(out, times.gather(1, position))

    def forward(self, history: torch.Tensor, lengths: torch.Tensor, contextual: torch.Tensor,
                actions: torch.Tensor, watchtimes: torch.Tensor, timestamps: torch.Tensor,
                candidates: torch.Tensor, counts: torch.Tensor,
                candidate_timestamps: torch.Tensor) -> torch.Tensor:
        users = self.users(history, lengths, contextual, actions, watchtimes, timestamps,
                           candidates, counts, candidate_timestamps)
        return self.fusion(users, self.items(candidates).to(users.dtype))
