"""Multi-layer perceptron with TorchEasyRec's MLP options.

Each layer is ``Linear -> [BatchNorm | LayerNorm] -> activation -> [Dropout]``; a linear
layer followed by batch norm has no bias (the norm's shift takes its place), as in
TorchEasyRec.
Inputs may have extra leading dimensions, (..., in_features): the norms see
them flattened, so a (B, L, D) attention input normalizes over all B * L rows.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from hashrec.modules.activation import (
    canonical_activation,
    create_activation,
    single_row_batch_norm,
)
from hashrec.modules.dropout import Dropout


@dataclass(frozen=True)
class MLPOptions:
    """Options of one MLP.

    Attributes:
        hidden_units: output size of each layer, in order (at least one).
        dropout_ratio: one ratio for every layer, or one per layer; empty for none.
        activation: activation after each layer (``nn.ReLU``, ``nn.Dice``, ...).
        use_bn: batch norm after each linear layer.
        use_ln: layer norm after each linear layer (not together with use_bn).
        bias: linear layers have a bias term (not those followed by batch norm, whose shift
            would cancel it).
    """

    hidden_units: tuple[int, ...] = (64,)
    dropout_ratio: tuple[float, ...] = ()
    activation: str = "nn.ReLU"
    use_bn: bool = False
    use_ln: bool = False
    bias: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "hidden_units", tuple(int(u) for u in self.hidden_units))
        ratios = self.dropout_ratio
        if isinstance(ratios, (int, float)):
            ratios = (ratios,)
        object.__setattr__(self, "dropout_ratio", tuple(float(r) for r in ratios))
        if not self.hidden_units:
            raise ValueError("MLPOptions.hidden_units must name at least one layer, got ()")
        bad = [u for u in self.hidden_units if u <= 0]
        if bad:
            raise ValueError(f"MLPOptions.hidden_units must be > 0, got {self.hidden_units}")
        if len(self.dropout_ratio) not in (0, 1, len(self.hidden_units)):
            raise ValueError(
                f"MLPOptions.dropout_ratio has {len(self.dropout_ratio)} values; allowed: "
                f"0, 1 or one per hidden unit ({len(self.hidden_units)})")
        if any(not 0.0 <= r < 1.0 for r in self.dropout_ratio):
            raise ValueError(
                f"MLPOptions.dropout_ratio={self.dropout_ratio}: each must be in [0, 1)")
        if self.use_bn and self.use_ln:
            raise ValueError("MLPOptions: use_bn and use_ln are exclusive; set at most one")
        canonical_activation(self.activation)

    def dropout_of(self, layer: int) -> float:
        """Dropout ratio of layer ``layer``."""
        if not self.dropout_ratio:
            return 0.0
        if len(self.dropout_ratio) == 1:
            return self.dropout_ratio[0]
        return self.dropout_ratio[layer]


class _FlatNorm(nn.Module):
    """Apply a batch norm to (..., dim) by flattening the leading dimensions (a training
    batch of one row is normalized by the running statistics: ``single_row_batch_norm``)."""

    def __init__(self, norm: nn.BatchNorm1d) -> None:
        super().__init__()
        self.norm = norm

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        flat = x.reshape(-1, x.shape[-1])
        if self.training and flat.shape[0] == 1:
            norm = self.norm
            flat = single_row_batch_norm(flat, norm.running_mean, norm.running_var, norm.weight,
                                         norm.bias, norm.eps)
        else:
            flat = self.norm(flat)
        return flat.reshape(x.shape)


class Perceptron(nn.Module):
    """One MLP layer: linear, optional norm, activation, optional dropout."""

    def __init__(self, in_features: int, out_features: int, options: MLPOptions,
                 layer: int) -> None:
        super().__init__()
        bias = options.bias and not options.use_bn
        parts: list[nn.Module] = [nn.Linear(in_features, out_features, bias=bias)]
        if options.use_bn:
            parts.append(_FlatNorm(nn.BatchNorm1d(out_features)))
        if options.use_ln:
            parts.append(nn.LayerNorm(out_features))
        parts.append(create_activation(options.activation, out_features))
        ratio = options.dropout_of(layer)
        if ratio > 0:
            parts.append(Dropout(ratio))
        self.layers = nn.Sequential(*parts)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        # A checkpoint written when a linear layer kept its bias before batch norm holds
        # one: folded into the norm's running mean it computes the same function (the
        # batch's mean cancels it in training, where it received no gradient either).
        bias, mean = prefix + "layers.0.bias", prefix + "layers.1.norm.running_mean"
        if self.layers[0].bias is None and bias in state_dict and mean in state_dict:
            state_dict[mean] = state_dict[mean] - state_dict.pop(bias).to(state_dict[mean])
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)

    def linear_weight(self) -> torch.Tensor:
        return self.layers[0].weight

    def linear_bias(self) -> torch.Tensor | None:
        return self.layers[0].bias

    def after_linear(self, x: torch.Tensor) -> torch.Tensor:
        """The layer applied to an already computed linear output (norm, activation, ...)."""
        for i, part in enumerate(self.layers):
            if i > 0:
                x = part(x)
        return x


class MLP(nn.Module):
    """Stack of perceptrons.

    Args:
        in_features: size of the input's last dimension.
        options: layer sizes, dropout, activation and norms.

    Shapes: (..., in_features) -> (..., options.hidden_units[-1]).
    """

    def __init__(self, in_features: int, options: MLPOptions) -> None:
        super().__init__()
        if in_features <= 0:
            raise ValueError(f"MLP in_features must be > 0, got {in_features}")
        sizes = (in_features, *options.hidden_units)
        self.layers = nn.Sequential(*[
            Perceptron(sizes[i], sizes[i + 1], options, i)
            for i in range(len(options.hidden_units))])
        self.options = options

    def output_dim(self) -> int:
        """Size of the output's last dimension."""
        return self.options.hidden_units[-1]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)

    def hidden_outputs(self, x: torch.Tensor) -> list[torch.Tensor]:
        """Each layer's output, in order (the last is ``forward``'s)."""
        outputs: list[torch.Tensor] = []
        for layer in self.layers:
            x = layer(x)
            outputs.append(x)
        return outputs

    def first_weight(self) -> torch.Tensor:
        """Weight of the first linear layer (callers may compute its output their own way)."""
        return self.layers[0].linear_weight()

    def first_bias(self) -> torch.Tensor | None:
        """Bias of the first linear layer (None without bias)."""
        return self.layers[0].linear_bias()

    def after_first_linear(self, x: torch.Tensor) -> torch.Tensor:
        """The MLP applied to the first linear layer's output ``x`` (..., hidden_units[0])."""
        for i, layer in enumerate(self.layers):
            x = layer.after_linear(x) if i == 0 else layer(x)
        return x
