"""What goes into the STU layers of dlrm_hstu, TorchEasyRec's generative ranking model: a
row's history and its candidates in one padded sequence, its contextual tokens first.

Histories (B, L, ...) and candidates (B, K, ...) are padded, with their lengths n (B,)
and k (B,). ``pack`` puts a row's k candidates right after its n history positions:
slot s of the (B, L + K, ...) result holds history position s (s < n), candidate s - n
(n <= s < n + k), or padding; candidate j of a row sits at slot n + j.

``ContentEncoder`` makes history positions (Du wide) and candidates (Dt wide) one width:
``slice_content_encoder`` a candidate's first Du values (Dt >= Du); ``pad_content_encoder``
a history position followed by a learned vector (normal, std 0.1) to Dt (Dt > Du);
``mlp_content_encoder`` the history through one MLP, the candidates through another, of
one output width.

``TargetPreprocessor`` (TorchEasyRec's ``contextual_preprocessor`` and
``contextual_interleave_preprocessor``): the packed content through the content MLP (a
contextualized MLP), plus, with an action encoder, the packed actions through the action
MLP, where a history position's actions are its bits (``ActionEncoder``) and every
candidate's one learned vector (normal, std 0.1: its actions are what is predicted).
Interleaving (``enable_interleaving``) makes each history position two tokens, its
content then its actions, and each candidate too in training (its content token is its
output); in evaluation a candidate is its content token alone. Without interleaving a
position is content + actions. Then C contextual tokens before everything, contextual
feature i through a linear layer of its own (or, concatenated, one token of all of
them), timestamps 0.
"""

import torch
from torch import nn

from hashrec.modules.hstu_inputs import contextual_parameters, contextual_tokens

CONTENT_ENCODERS = ("slice_content_encoder", "pad_content_encoder", "mlp_content_encoder")


def pack(history: torch.Tensor, lengths: torch.Tensor, targets: torch.Tensor,
         counts: torch.Tensor) -> torch.Tensor:
    """A row's history then its candidates (see the module docstring): history (B, L, ...),
    lengths (B,), targets (B, K, ...), counts (B,) -> (B, L + K, ...); padding slots hold
    arbitrary entries of the inputs."""
    length, count = history.shape[1], targets.shape[1]
    steps = torch.arange(length + count, device=history.device).unsqueeze(0)
    n = lengths.unsqueeze(1).to(steps.dtype)
    k = counts.unsqueeze(1).to(steps.dtype)
    index = torch.where(steps < n, steps, torch.where(steps < n + k, steps - n + length, steps))
    both = torch.cat([history, targets], dim=1)
    if both.dim() == 3:
        index = index.unsqueeze(-1).expand(-1, -1, both.shape[2])
    return both.gather(1, index)


class ContentEncoder(nn.Module):
    """The content encoders (see the module docstring): history (B, L, Du), targets
    (B, K, Dt) -> (B, L, Dc), (B, K, Dc); ``output_dim`` Dc.

    Args:
        kind: one of ``CONTENT_ENCODERS``.
        history_dim: Du.
        target_dim: Dt.
        history_mlp, target_mlp: the MLPs of ``mlp_content_encoder`` (their output widths
            agree); None for the other kinds.
    """

    kind: str
    history_dim: int

    def __init__(self, kind: str, history_dim: int, target_dim: int,
                 history_mlp: nn.Module | None = None,
                 target_mlp: nn.Module | None = None, output_dim: int = 0) -> None:
        super().__init__()
        if kind not in CONTENT_ENCODERS:
            raise ValueError(f"kind={kind!r}; allowed: {', '.join(CONTENT_ENCODERS)}")
        if kind == "slice_content_encoder" and target_dim < history_dim:
            raise ValueError(f"slice_content_encoder takes a candidate's first {history_dim} "
                             f"values (the history's width), but candidates are "
                             f"{target_dim} wide; use pad_content_encoder or "
                             f"mlp_content_encoder")
        if kind == "pad_content_encoder" and target_dim <= history_dim:
            raise ValueError(f"pad_content_encoder pads the history ({history_dim} wide) to "
                             f"the candidates' width {target_dim}, which must be larger; "
                             f"use slice_content_encoder")
        if kind == "mlp_content_encoder" and (history_mlp is None or target_mlp is None):
            raise ValueError("mlp_content_encoder needs uih_mlp and target_mlp")
        self.kind = kind
        self.history_dim = history_dim
        self.history_mlp = history_mlp if history_mlp is not None else nn.Identity()
        self.target_mlp = target_mlp if target_mlp is not None else nn.Identity()
        padding = max(target_dim - history_dim, 1) if kind == "pad_content_encoder" else 1
        self.padding = nn.Parameter(torch.empty(1, 1, padding).normal_(0.0, 0.1))
        self.output_dim = {"slice_content_encoder": history_dim,
                           "pad_content_encoder": target_dim,
                           "mlp_content_encoder": output_dim}[kind]

    def forward(self, history: torch.Tensor, targets: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.kind == "slice_content_encoder":
            return history, targets[:, :, :self.history_dim]
        if self.kind == "pad_content_encoder":
            pad = self.padding.to(history.dtype).expand(history.shape[0], history.shape[1], -1)
            return torch.cat([history, pad], dim=-1), targets
        return self.history_mlp(history), self.target_mlp(targets)


class TargetPreprocessor(nn.Module):
    """The dlrm_hstu preprocessors (see the module docstring).

    Args:
        content: the ``ContentEncoder``.
        content_mlp: the contextualized MLP of the content (Dc -> D).
        embedding_dim: D.
        contextual_count: C, the contextual tokens (0: none).
        contextual_dim: Dx, each contextual token's input width.
        actions: the ``ActionEncoder`` (None: no actions).
        action_mlp: the contextualized MLP of the actions (with ``actions``).
        interleave: each position's content and actions two tokens (needs ``actions``).

    Shapes: history (B, L, Du), lengths (B,), targets (B, K, Dt), counts (B,), contextual
    (B, C * Dx), actions (B, L) int64, watchtimes (B, L), timestamps (B, L), target
    timestamps (B, K) -> (tokens (B, S, D), lengths (B,) of the rows' tokens, timestamps
    (B, S), the targets' tokens a row (B,), each candidate's token (B, K)); S = C + L + K
    without interleaving, C + 2 (L + K) with.
    """

    contextual_count: int
    interleave: bool

    def __init__(self, content: ContentEncoder, content_mlp: nn.Module, embedding_dim: int,
                 contextual_count: int = 0, contextual_dim: int = 0,
                 actions: nn.Module | None = None, action_mlp: nn.Module | None = None,
                 interleave: bool = False) -> None:
        super().__init__()
        if (actions is None) != (action_mlp is None):
            raise ValueError("actions and action_mlp go together: give both, or neither")
        if interleave and actions is None:
            raise ValueError("interleaving makes each position's actions a token: it needs "
                             "action_encoder and action_mlp")
        self.content = content
        self.content_mlp = content_mlp
        self.actions = actions
        self.action_mlp = action_mlp
        width = actions.output_dim if actions is not None else 1
        self.target_action = nn.Parameter(torch.empty(1, 1, width).normal_(0.0, 0.1))
        self.interleave = interleave
        self.contextual_count = contextual_count
        self.contextual_weights, self.contextual_bias = contextual_parameters(
            contextual_count, contextual_dim, embedding_dim)

    def forward(self, history: torch.Tensor, lengths: torch.Tensor, targets: torch.Tensor,
                counts: torch.Tensor, contextual: torch.Tensor, actions: torch.Tensor,
                watchtimes: torch.Tensor, timestamps: torch.Tensor,
                target_timestamps: torch.Tensor
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                           torch.Tensor]:
        history_content, target_content = self.content(history, targets)
        content = self.content_mlp(pack(history_content, lengths, target_content, counts),
                                   contextual)
        times = pack(timestamps, lengths, target_timestamps, counts)
        count = targets.shape[1]
        steps = torch.arange(count, device=counts.device).unsqueeze(0)
        position = lengths.unsqueeze(1) + steps
        total, num_targets = lengths + counts, counts
        x = content
        if self.actions is not None and self.action_mlp is not None:
            encoded = self.actions(actions, watchtimes)
            target = self.target_action.to(encoded.dtype).expand(
                encoded.shape[0], count, encoded.shape[2])
            acted = self.action_mlp(pack(encoded, lengths, target, counts).to(content.dtype),
                                    contextual)
            if self.interleave:
                x, times, total, num_targets, position = self._interleaved(
                    content, acted, times, lengths, counts, position)
            else:
                x = content + acted
        if self.contextual_count == 0:
            return x, total, times, num_targets, position
        tokens = contextual_tokens(contextual, self.contextual_weights, self.contextual_bias,
                                   x.dtype)
        zeros = torch.zeros(times.shape[0], self.contextual_count, dtype=times.dtype,
                            device=times.device)
        return (torch.cat([tokens, x], dim=1), total + self.contextual_count,
                torch.cat([zeros, times], dim=1), num_targets,
                position + self.contextual_count)

    def _interleaved(self, content: torch.Tensor, acted: torch.Tensor, times: torch.Tensor,
                     lengths: torch.Tensor, counts: torch.Tensor, position: torch.Tensor
                     ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor,
                                torch.Tensor]:
        """Content and action tokens interleaved: every position's two in training; in
        evaluation the candidates' content tokens alone after the history's two each."""
        rows, slots = content.shape[0], content.shape[1]
        x = torch.stack([content, acted], dim=2).reshape(rows, 2 * slots, content.shape[2])
        times = times.repeat_interleave(2, dim=1)
        if self.training:
            return x, times, 2 * (lengths + counts), 2 * counts, 2 * position
        steps = torch.arange(2 * slots, device=x.device).unsqueeze(0)
        history = 2 * lengths.unsqueeze(1)
        ends = history + counts.unsqueeze(1)
        source = torch.where(steps < history, steps,
                             torch.where(steps < ends, 2 * steps - history, steps))
        source = source.clamp(max=2 * slots - 1)
        x = x.gather(1, source.unsqueeze(-1).expand(-1, -1, x.shape[2]))
        times = times.gather(1, source)
        first = 2 * lengths.unsqueeze(1)
        return x, times, 2 * lengths + counts, counts, \
            first + (position - lengths.unsqueeze(1))
