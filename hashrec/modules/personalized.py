"""PEPNet's personalization blocks (Chang et al. 2023, https://arxiv.org/abs/2302.01115).

* ``GateNU``: a gate network unit, gamma * sigmoid(W2 relu(W1 x + b1) + b2), each gate
  value in (0, gamma); with gamma 2 a gate of 1 leaves its input as it was, so a gate can
  both damp and amplify.
* ``EPNet`` (embedding personalization): scales the main embeddings E (B, D) column by
  column by a gate over [domain features, E held constant], E * gate (B, D).
* ``PPNet`` (parameter personalization): a task's tower of hidden layers, each
  ``linear -> activation``, times a gate over [user/item/author prior features, the
  tower's input held constant], then dropout.
* ``DomainTowers`` and ``pick_domain``: a task's tower per domain (TorchEasyRec's
  ``domain_input_name``), every tower run on every row, and each row's domain's logits
  picked from them by a gather on the row's domain index (fixed shapes, no host reads).

The gates read the main input without passing it a gradient, as the paper's
stop-gradient does: the gates personalize the embeddings, they do not train them.
Every shape is fixed by the batch size (CUDA-graph friendly).
"""

from __future__ import annotations

import torch
from torch import nn

from hashrec.modules.activation import create_activation
from hashrec.modules.dropout import Dropout


class GateNU(nn.Module):
    """A gate network unit: ``x (..., in_dim) -> gamma * sigmoid(MLP(x)) (..., out_dim)``,
    the MLP one ReLU hidden layer of ``hidden_dim`` units.

    Args:
        in_dim: width of the gate's input.
        hidden_dim: width of its hidden layer.
        out_dim: width of the gate (the layer it scales).
        gamma: the gate's upper bound (> 0).
    """

    def __init__(self, in_dim: int, hidden_dim: int, out_dim: int, gamma: float = 2.0) -> None:
        super().__init__()
        for name, value in (("in_dim", in_dim), ("hidden_dim", hidden_dim),
                            ("out_dim", out_dim)):
            if value < 1:
                raise ValueError(f"GateNU.{name}={value}; allowed: 1 or more")
        if not gamma > 0 or gamma == float("inf"):
            raise ValueError(f"GateNU.gamma={gamma}; allowed: a finite number > 0")
        self.gamma = float(gamma)
        self.hidden = nn.Linear(in_dim, hidden_dim)
        self.output = nn.Linear(hidden_dim, out_dim)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.gamma * torch.sigmoid(self.output(torch.relu(self.hidden(x))))


class EPNet(nn.Module):
    """Embedding personalization: ``forward(main (B, D), domain (B, Dd)) -> (B, D)``,
    ``main * gate([domain, main held constant])``.

    Args:
        main_dim: D, the main group's width.
        domain_dim: Dd, the domain group's width.
        hidden_dim: the gate's hidden width.
        gamma: the gate's upper bound.
    """

    def __init__(self, main_dim: int, domain_dim: int, hidden_dim: int,
                 gamma: float = 2.0) -> None:
        super().__init__()
        self.gate = GateNU(domain_dim + main_dim, hidden_dim, main_dim, gamma)

    def forward(self, main: torch.Tensor, domain: torch.Tensor) -> torch.Tensor:
        return main * self.gate(torch.cat([domain, main.detach()], dim=-1))


class PPNetLayer(nn.Module):
    """One gated hidden layer of a PPNet tower: ``forward(x (B, in), prior (B, P)) ->
    dropout(activation(linear(x)) * gate(prior)) (B, units)``, ``prior`` the gate's input
    (the prior features and the tower's input, held constant)."""

    def __init__(self, in_dim: int, units: int, prior_dim: int, activation: str,
                 dropout: float, gamma: float) -> None:
        super().__init__()
        self.linear = nn.Linear(in_dim, units)
        self.activation = create_activation(activation, units)
        self.gate = GateNU(prior_dim, units, units, gamma)
        self.dropout = Dropout(dropout) if dropout > 0 else nn.Identity()

    def forward(self, x: torch.Tensor, prior: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.activation(self.linear(x)) * self.gate(prior))


class PPNet(nn.Module):
    """One task's parameter-personalized tower: ``forward(x (B, D), uia (B, P)) ->
    (B, hidden_units[-1])``, the gated layers in order, every gate reading
    ``[uia, x held constant]``.

    Args:
        in_dim: D, the tower's input width.
        uia_dim: P, the prior (user/item/author) features' width.
        hidden_units: the layers' widths (at least one).
        activation: each layer's activation (``nn.ReLU``, ...).
        dropout: one ratio per layer.
        gamma: the gates' upper bound.
    """

    def __init__(self, in_dim: int, uia_dim: int, hidden_units: tuple[int, ...],
                 activation: str = "nn.ReLU", dropout: tuple[float, ...] = (),
                 gamma: float = 2.0) -> None:
        super().__init__()
        if not hidden_units:
            raise ValueError("PPNet.hidden_units is empty; name at least one layer")
        dropout = tuple(dropout) or (0.0,) * len(hidden_units)
        if len(dropout) != len(hidden_units):
            raise ValueError(f"PPNet.dropout has {len(dropout)} ratios for "
                             f"{len(hidden_units)} layers; give one per layer")
        widths = (in_dim, *hidden_units)
        self.layers = nn.ModuleList([
            PPNetLayer(widths[i], widths[i + 1], uia_dim + in_dim, activation, dropout[i],
                       gamma) for i in range(len(hidden_units))])
        self.out_dim = int(hidden_units[-1])

    def forward(self, x: torch.Tensor, uia: torch.Tensor) -> torch.Tensor:
        prior = torch.cat([uia, x.detach()], dim=-1)
        for layer in self.layers:
            x = layer(x, prior)
        return x


class DomainTowers(nn.Module):
    """A task's tower per domain: ``forward(x (B, D)) -> (B, K * C)``, the K towers'
    logits (C each) side by side, domain 0 first. Every tower reads every row; the loss
    and the metrics read, on each row, its domain's (``pick_domain``).

    Args:
        towers: the K towers, (B, D) -> (B, C) each.
    """

    def __init__(self, towers: list[nn.Module]) -> None:
        super().__init__()
        if not towers:
            raise ValueError("DomainTowers.towers is empty; give one tower per domain")
        self.towers = nn.ModuleList(towers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([tower(x) for tower in self.towers], dim=-1)


def pick_domain(logits: torch.Tensor, domains: torch.Tensor, num_domains: int) -> torch.Tensor:
    """Each row's domain's logits: ``logits (B, K * C)`` (K domains' C columns side by
    side, as ``DomainTowers`` gives them), ``domains (B,)`` int64 ids in [0, K) ->
    (B, C). A gather: the other domains' towers get no gradient from the row."""
    blocks = logits.reshape(logits.shape[0], num_domains, -1)
    index = domains.reshape(-1, 1, 1).expand(-1, 1, blocks.shape[2])
    return blocks.gather(1, index).squeeze(1)
