"""Activation functions named the way TorchEasyRec configs name them.

Configs write ``activation: "nn.ReLU"``; the ``nn.`` prefix is optional and an
empty string means no activation.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn


def single_row_batch_norm(x: torch.Tensor, running_mean: torch.Tensor | None,
                          running_var: torch.Tensor | None, weight: torch.Tensor | None,
                          bias: torch.Tensor | None, eps: float) -> torch.Tensor:
    """Batch norm of a training batch of one row x (1, dim), by the running statistics.

    One row has no variance to normalize with (``BatchNorm1d`` raises on it in
    training). Such a batch, e.g. an epoch's last partial batch, is normalized as in
    evaluation and leaves the running statistics as they are.
    """
    return nn.functional.batch_norm(x, running_mean, running_var, weight, bias, False, 0.0, eps)


class Dice(nn.Module):
    """DIN's data-adaptive activation: ``p * x + (1 - p) * alpha * x``.

    ``p = sigmoid(batch_norm(x))`` with a batch norm over the last dimension (learned
    scale and shift, eps 1e-5: TorchEasyRec's Dice), so the rectifier point follows the
    input distribution; ``alpha`` starts at 0.

    Args:
        dim: size of the last input dimension.
        eps: batch-norm epsilon.
    """

    def __init__(self, dim: int, eps: float = 1e-5) -> None:
        super().__init__()
        self.norm = nn.BatchNorm1d(dim, eps=eps)
        self.alpha = nn.Parameter(torch.zeros(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x (..., dim) -> (..., dim)."""
        flat = x.reshape(-1, x.shape[-1])
        if self.training and flat.shape[0] == 1:
            norm = self.norm
            normed = single_row_batch_norm(flat, norm.running_mean, norm.running_var,
                                           norm.weight, norm.bias, norm.eps)
        else:
            normed = self.norm(flat)
        p = torch.sigmoid(normed).reshape(x.shape)
        return p * x + (1.0 - p) * self.alpha * x


_SIMPLE: dict[str, Callable[[], nn.Module]] = {
    "ReLU": nn.ReLU,
    "LeakyReLU": nn.LeakyReLU,
    "PReLU": nn.PReLU,
    "ELU": nn.ELU,
    "GELU": nn.GELU,
    "SiLU": nn.SiLU,
    "Sigmoid": nn.Sigmoid,
    "Tanh": nn.Tanh,
    "Identity": nn.Identity,
}

ACTIVATIONS = tuple(sorted([*_SIMPLE, "Dice"]))


def canonical_activation(name: str | None) -> str:
    """``"nn.ReLU"`` -> ``"ReLU"``; empty or None -> ``"Identity"``.

    Raises:
        ValueError: the name is not one of ``ACTIVATIONS``.
    """
    if not name:
        return "Identity"
    short = name[3:] if name.startswith("nn.") else name
    if short not in ACTIVATIONS:
        raise ValueError(
            f"activation={name!r} is not supported; allowed: "
            f"{', '.join('nn.' + a for a in ACTIVATIONS)} or empty for none")
    return short


def create_activation(name: str | None, dim: int) -> nn.Module:
    """Build the activation module ``name`` for inputs whose last dimension is ``dim``."""
    short = canonical_activation(name)
    if short == "Dice":
        return Dice(dim)
    return _SIMPLE[short]()
