"""Activation functions named the way TorchEasyRec configs name them.

Configs write ``activation: "nn.ReLU"`` or, with keyword arguments,
``"nn.LeakyReLU(negative_slope=0.2)"``; the ``nn.`` prefix is optional and an empty string
means no activation.
"""

from __future__ import annotations

import ast
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

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        # A checkpoint written before the batch norm learned a scale and shift holds
        # neither: it loads as scale 1 and shift 0, the function it was trained as (but
        # for the larger eps).
        if prefix + "norm.running_mean" in state_dict:
            state_dict.setdefault(prefix + "norm.weight", torch.ones_like(self.norm.weight))
            state_dict.setdefault(prefix + "norm.bias", torch.zeros_like(self.norm.bias))
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

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


# Element-wise activations of torch.nn, by class name (each keeps its input's shape).
_SIMPLE: dict[str, Callable[..., nn.Module]] = {name: getattr(nn, name) for name in (
    "CELU", "ELU", "GELU", "Hardshrink", "Hardsigmoid", "Hardswish", "Hardtanh", "Identity",
    "LeakyReLU", "LogSigmoid", "Mish", "PReLU", "ReLU", "ReLU6", "RReLU", "SELU", "SiLU",
    "Sigmoid", "Softplus", "Softshrink", "Softsign", "Tanh", "Tanhshrink", "Threshold")}

ACTIVATIONS = tuple(sorted([*_SIMPLE, "Dice"]))


def parse_activation(name: str | None) -> tuple[str, dict]:
    """``"nn.LeakyReLU(negative_slope=0.2)"`` -> ``("LeakyReLU", {"negative_slope": 0.2})``,
    TorchEasyRec's form: an optional ``nn.`` or ``torch.nn.`` prefix, then keyword
    arguments of literal values; empty or None -> ``("Identity", {})``.

    Raises:
        ValueError: the name is not one of ``ACTIVATIONS``, or its arguments do not parse
            or are not the activation's.
    """
    text = (name or "").strip()
    if not text:
        return "Identity", {}
    short, _, args = text.partition("(")
    short = short.strip()
    for prefix in ("torch.nn.", "nn."):
        if short.startswith(prefix):
            short = short[len(prefix):]
            break
    if short not in ACTIVATIONS:
        raise ValueError(
            f"activation={name!r} is not supported; allowed: "
            f"{', '.join('nn.' + a for a in ACTIVATIONS)} (with keyword arguments, such as "
            f"nn.LeakyReLU(negative_slope=0.2)) or empty for none")
    kwargs = _keyword_arguments(name, args) if args or text.endswith(")") else {}
    if kwargs and short == "Dice":
        raise ValueError(f"activation={name!r}: Dice takes no arguments")
    if short != "Dice":
        try:
            _SIMPLE[short](**kwargs)
        except (TypeError, ValueError) as err:
            raise ValueError(f"activation={name!r}: {err}") from None
    return short, kwargs


def _keyword_arguments(name: str, args: str) -> dict:
    """The keyword arguments of ``name(args`` (``args`` ends with ``)``)."""
    if not args.rstrip().endswith(")"):
        raise ValueError(f"activation={name!r}: the arguments' parenthesis is not closed")
    try:
        call = ast.parse(f"f({args.rstrip()[:-1]})", mode="eval").body
        if not isinstance(call, ast.Call) or call.args:
            raise ValueError("positional argument")
        return {kw.arg: ast.literal_eval(kw.value) for kw in call.keywords}
    except (SyntaxError, ValueError, TypeError) as err:
        raise ValueError(f"activation={name!r}: arguments must be keyword=literal pairs, "
                         f"such as negative_slope=0.2 ({err})") from None


def canonical_activation(name: str | None) -> str:
    """``"nn.ReLU"`` -> ``"ReLU"``; empty or None -> ``"Identity"`` (arguments checked and
    left out: see ``parse_activation``).

    Raises:
        ValueError: as ``parse_activation``.
    """
    return parse_activation(name)[0]


def create_activation(name: str | None, dim: int) -> nn.Module:
    """Build the activation module ``name`` (with its arguments) for inputs whose last
    dimension is ``dim``."""
    short, kwargs = parse_activation(name)
    if short == "Dice":
        return Dice(dim)
    return _SIMPLE[short](**kwargs)
