"""What goes into the STU layers of an HSTU user tower: TorchEasyRec's UIH preprocessor, its
action encoder and its contextualized MLPs, over padded (B, L, ...) histories.

``UIHPreprocessor`` (history (B, L, Du) -> (B, C + L, D)): each history position's
embedding through a linear layer to D, plus, with an action encoder, its actions
through ``ActionEncoder`` and the action MLP; before the history, C contextual tokens,
contextual feature i (Dc wide) through a linear layer of its own to D. TorchEasyRec's
UIH preprocessor source was not available to compare: it is documented to project the
history and to handle the contextual features and the actions, and this follows its
other preprocessors (their contextual tokens, action encoder and action MLP), with a
linear layer (xavier weights, zero bias) as the projection.

``ActionEncoder``: a position's actions are a bitmask; action bit i set gives
embedding i (E wide), unset gives zeros; the A embeddings side by side (B, L, A * E).
Watch-time thresholds set more bits: bit w_i where the watch time is at least t_i.

The contextualized MLPs map (B, L, I) -> (B, L, O): ``simple_mlp`` Linear(I, hidden),
x * sigmoid(LayerNorm(x)), Linear(hidden, O), LayerNorm; ``parameterized_mlp`` gives
each row its own (I x O) matrix and O bias from its contextual features (after
dropout): compress = Linear(Dctx, hidden)(ctx); W = LayerNorm([I, O])(Linear(hidden,
I * O)(compress)); bias = Linear(hidden, O)(x * sigmoid(LayerNorm(x)) of
Linear(hidden, hidden)(compress)); out = seq @ W + bias.
"""

import math

import torch
from torch import nn

from hashrec.modules.dropout import dropout

CONTEXTUALIZED_MLPS = ("simple_mlp", "parameterized_mlp")


def xavier(linear: nn.Linear) -> nn.Linear:
    nn.init.xavier_uniform_(linear.weight)
    nn.init.zeros_(linear.bias)
    return linear


def contextual_parameters(count: int, width: int, embedding_dim: int
                          ) -> tuple[nn.Parameter, nn.Parameter]:
    """The contextual tokens' linear layers, one a token: (C, Dx, D) weights drawn as
    TorchEasyRec draws them and (C, D) zero biases (one unused row without tokens)."""
    rows = max(count, 1)
    std = math.sqrt(2.0 / float(max(width, 1) + embedding_dim))
    weights = nn.Parameter(torch.empty(rows, max(width, 1), embedding_dim).normal_(0.0, std))
    return weights, nn.Parameter(torch.zeros(rows, embedding_dim))


def contextual_tokens(contextual: torch.Tensor, weights: torch.Tensor, bias: torch.Tensor,
                      dtype: torch.dtype) -> torch.Tensor:
    """Contextual token i: feature i of (B, C * Dx) through its own linear layer ->
    (B, C, D)."""
    features = contextual.reshape(contextual.shape[0], weights.shape[0], weights.shape[1])
    return torch.einsum("bci,cio->bco", features.to(dtype), weights.to(dtype)) \
        + bias.to(dtype)


class SwishLayerNorm(nn.Module):
    """x * sigmoid(LayerNorm(x)) (eps 1e-5, with weight and bias)."""

    def __init__(self, dim: int) -> None:
        super().__init__()
        self.norm = nn.LayerNorm(dim, eps=1e-5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * torch.sigmoid(self.norm(x))


class SimpleContextualizedMLP(nn.Module):
    """``simple_mlp`` (see the module docstring): sequence (B, L, I), contextual (not read)
    -> (B, L, O)."""

    def __init__(self, input_dim: int, output_dim: int, hidden_dim: int) -> None:
        super().__init__()
        self.mlp = nn.Sequential(xavier(nn.Linear(input_dim, hidden_dim)),
                                 SwishLayerNorm(hidden_dim),
                                 xavier(nn.Linear(hidden_dim, output_dim)),
                                 nn.LayerNorm(output_dim, eps=1e-5))

    def forward(self, sequence: torch.Tensor, contextual: torch.Tensor) -> torch.Tensor:
        return self.mlp(sequence)


class ParameterizedContextualizedMLP(nn.Module):
    """``parameterized_mlp`` (see the module docstring): sequence (B, L, I), contextual
    (B, Dctx) -> (B, L, O)."""

    def __init__(self, input_dim: int, output_dim: int, hidden_dim: int,
                 contextual_dim: int, contextual_dropout_ratio: float = 0.3) -> None:
        super().__init__()
        if contextual_dim < 1:
            raise ValueError("parameterized_mlp reads the contextual features: it needs a "
                             "DEEP feature group 'contextual'")
        self.input_dim, self.output_dim = input_dim, output_dim
        self.dropout_ratio = contextual_dropout_ratio
        self.compress = xavier(nn.Linear(contextual_dim, hidden_dim))
        self.raw_weights = xavier(nn.Linear(hidden_dim, input_dim * output_dim))
        self.weights_norm = nn.LayerNorm([input_dim, output_dim])
        self.bias = nn.Sequential(xavier(nn.Linear(hidden_dim, hidden_dim)),
                                  SwishLayerNorm(hidden_dim),
                                  xavier(nn.Linear(hidden_dim, output_dim)))

    def forward(self, sequence: torch.Tensor, contextual: torch.Tensor) -> torch.Tensor:
        context = dropout(contextual, self.dropout_ratio, self.training)
        shared = self.compress(context.to(sequence.dtype))
        weights = self.weights_norm(self.raw_weights(shared).reshape(
            -1, self.input_dim, self.output_dim))
        return torch.bmm(sequence, weights) + self.bias(shared).unsqueeze(1)


def contextualized_mlp(kind: str, input_dim: int, output_dim: int, hidden_dim: int,
                       contextual_dim: int = 0,
                       contextual_dropout_ratio: float = 0.3) -> nn.Module:
    """The contextualized MLP ``kind`` (``simple_mlp`` or ``parameterized_mlp``)."""
    if kind not in CONTEXTUALIZED_MLPS:
        raise ValueError(f"kind={kind!r}; allowed: {', '.join(CONTEXTUALIZED_MLPS)}")
    if hidden_dim < 1:
        raise ValueError(f"hidden_dim={hidden_dim}; it must be 1 or more")
    if kind == "simple_mlp":
        return SimpleContextualizedMLP(input_dim, output_dim, hidden_dim)
    return ParameterizedContextualizedMLP(input_dim, output_dim, hidden_dim, contextual_dim,
                                          contextual_dropout_ratio)


class ActionEncoder(nn.Module):
    """TorchEasyRec's simple action encoder (see the module docstring).

    Shapes: actions (B, L) int64 bitmasks, watchtimes (B, L) (read with thresholds) ->
    (B, L, A * E), A the action bits (``action_weights`` then the watch-time bits).
    """

    def __init__(self, action_embedding_dim: int, action_weights: list[int],
                 watchtime_thresholds: list[int], watchtime_weights: list[int],
                 init_std: float = 0.1) -> None:
        super().__init__()
        if action_embedding_dim < 1 or not action_weights:
            raise ValueError(f"action_embedding_dim={action_embedding_dim} and "
                             f"{len(action_weights)} action_weights; both must be 1 or more")
        if len(watchtime_thresholds) != len(watchtime_weights):
            raise ValueError(f"{len(watchtime_thresholds)} watch-time thresholds and "
                             f"{len(watchtime_weights)} bits; give each threshold its bit")
        self.register_buffer("bits", torch.tensor(list(action_weights) + list(watchtime_weights),
                                                  dtype=torch.int64))
        self.register_buffer("thresholds", torch.tensor([float(t) for t in watchtime_thresholds]))
        self.register_buffer("threshold_bits", torch.tensor(list(watchtime_weights),
                                                            dtype=torch.int64))
        count = len(action_weights) + len(watchtime_weights)
        self.table = nn.Parameter(torch.empty(count, action_embedding_dim).normal_(0.0, init_std))
        self.output_dim = count * action_embedding_dim

    def forward(self, actions: torch.Tensor, watchtimes: torch.Tensor) -> torch.Tensor:
        for i in range(self.thresholds.shape[0]):
            watched = (watchtimes >= self.thresholds[i]).to(torch.int64) * self.threshold_bits[i]
            actions = torch.bitwise_or(actions, watched)
        exploded = torch.bitwise_and(actions.unsqueeze(-1), self.bits) > 0
        embedded = exploded.unsqueeze(-1).to(self.table.dtype) * self.table
        return embedded.flatten(-2)


class UIHPreprocessor(nn.Module):
    """TorchEasyRec's UIH preprocessor (see the module docstring).

    Args:
        history_dim: Du, a history position's width.
        embedding_dim: D, the STU layers' width.
        contextual_count: C, the contextual features (0: none).
        contextual_dim: Dc, each contextual feature's width.
        actions: the action encoder (None: no actions).
        action_mlp: the contextualized MLP of the actions (with ``actions``).

    Shapes: history (B, L, Du), lengths (B,), contextual (B, C * Dc), actions (B, L),
    watchtimes (B, L), timestamps (B, L) -> (tokens (B, C + L, D), lengths + C,
    timestamps (B, C + L), the contextual tokens' 0).
    """

    contextual_count: int

    def __init__(self, history_dim: int, embedding_dim: int, contextual_count: int = 0,
                 contextual_dim: int = 0, actions: nn.Module | None = None,
                 action_mlp: nn.Module | None = None) -> None:
        super().__init__()
        self.content = xavier(nn.Linear(history_dim, embedding_dim))
        self.contextual_count = contextual_count
        self.contextual_weights, self.contextual_bias = contextual_parameters(
            contextual_count, contextual_dim, embedding_dim)
        if (actions is None) != (action_mlp is None):
            raise ValueError("actions and action_mlp go together: give both, or neither")
        self.actions = actions
        self.action_mlp = action_mlp

    def forward(self, history: torch.Tensor, lengths: torch.Tensor, contextual: torch.Tensor,
                actions: torch.Tensor, watchtimes: torch.Tensor, timestamps: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        tokens = self.content(history)
        if self.actions is not None and self.action_mlp is not None:
            tokens = tokens + self.action_mlp(self.actions(actions, watchtimes), contextual)
        if self.contextual_count == 0:
            return tokens, lengths, timestamps
        context = contextual_tokens(contextual, self.contextual_weights, self.contextual_bias,
                                    tokens.dtype)
        zeros = torch.zeros(timestamps.shape[0], self.contextual_count,
                            dtype=timestamps.dtype, device=timestamps.device)
        return (torch.cat([context, tokens], dim=1), lengths + self.contextual_count,
                torch.cat([zeros, timestamps], dim=1))
