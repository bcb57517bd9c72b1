"""An ``input_layer`` block's processing of its feature group (TorchEasyRec's
``InputLayer`` options), over the group's (B, D):

- ``do_batch_norm``: batch normalization of the D columns (running statistics in eval);
- ``do_layer_norm``: layer normalization over the D columns (not with ``do_batch_norm``);
- ``dropout_rate``: in training, dropout of single columns (kept ones scaled by 1/(1-p));
- ``feature_dropout_rate``: in training, each feature of the group (all its columns) is
  dropped in a row with this probability, independently per row and feature, the kept
  ones scaled by 1/(1-p).

They run in that order. A block package called with ``reset_input`` runs its input layers
with other options (a *variant*): the node keeps one option set per variant and the
variant is an argument of ``forward``; the norms' parameters are shared by all variants.
Shapes are fixed and nothing is read on the host (the masks are drawn on the device).
"""

import torch
from torch import nn

from hashrec.models.errors import ModelError
from hashrec.models.feature_groups import SEQUENCE, GroupSpec
from hashrec.modules.dropout import dropout


class NoInputLayer(nn.Module):
    """A block without input layer options: the value as it is."""

    def forward(self, value: list[torch.Tensor], variant: int = 0) -> list[torch.Tensor]:
        return value


class InputLayerNode(nn.Module):
    """[group (B, D)] -> [the group normalized and dropped out, see the module docstring].

    Args:
        widths: the width of each feature of the group, in column order (sum D).
        options: per variant, (batch norm, layer norm, dropout rate, feature dropout rate).
    """

    use_bn: list[bool]
    use_ln: list[bool]
    dropout: list[float]
    feature_dropout: list[float]

    def __init__(self, widths: list[int], options: list[tuple[bool, bool, float, float]]
                 ) -> None:
        super().__init__()
        width = sum(widths)
        self.use_bn = [o[0] for o in options]
        self.use_ln = [o[1] for o in options]
        self.dropout = [float(o[2]) for o in options]
        self.feature_dropout = [float(o[3]) for o in options]
        self.num_features = len(widths)
        self.bn = nn.BatchNorm1d(width) if any(self.use_bn) else nn.Identity()
        self.ln = nn.LayerNorm(width) if any(self.use_ln) else nn.Identity()
        feature_of_column = torch.repeat_interleave(torch.arange(len(widths)),
                                                    torch.tensor(widths))
        self.register_buffer("feature_of_column", feature_of_column, persistent=False)

    def forward(self, value: list[torch.Tensor], variant: int = 0) -> list[torch.Tensor]:
        x = value[0]
        if self.use_bn[variant]:
            x = self.bn(x)
        elif self.use_ln[variant]:
            x = self.ln(x)
        if self.training:
            rate = self.dropout[variant]
            if rate > 0.0:
                x = dropout(x, rate, True)
            rate = self.feature_dropout[variant]
            if rate > 0.0:
                keep = 1.0 - rate
                draws = torch.rand(x.shape[0], self.num_features, device=x.device)
                mask = (draws < keep).to(x.dtype) / keep
                x = x * mask.index_select(1, self.feature_of_column)
        return [x]


def input_layer_options(config, where: str) -> tuple[bool, bool, float, float]:
    """(batch norm, layer norm, dropout rate, feature dropout rate) of an ``InputLayer``.

    Raises:
        ModelError: both norms, or a rate outside [0, 1).
    """
    if config.do_batch_norm and config.do_layer_norm:
        raise ModelError(f"{where}: do_batch_norm and do_layer_norm are both set; keep one "
                         f"(as in TorchEasyRec, an input layer cannot do both)")
    for name in ("dropout_rate", "feature_dropout_rate"):
        rate = getattr(config, name)
        if not 0.0 <= rate < 1.0:
            raise ModelError(f"{where}.{name}={rate}; allowed: 0 <= rate < 1")
    return (config.do_batch_norm, config.do_layer_norm, config.dropout_rate,
            config.feature_dropout_rate)


def build_input_layer(configs: list, group: GroupSpec, where: str) -> nn.Module:
    """The node of a group's ``InputLayer`` messages ``configs`` (one per variant; the
    first is the block's own); ``NoInputLayer`` where none sets an option."""
    options = [input_layer_options(c, where + (".input_layer" if i == 0 else
                                               f" (reset_input {i})"))
               for i, c in enumerate(configs)]
    if not any(o[0] or o[1] or o[2] > 0 or o[3] > 0 for o in options):
        return NoInputLayer()
    if group.group_type == SEQUENCE:
        raise ModelError(f"{where}.input_layer: do_batch_norm, do_layer_norm, dropout_rate "
                         f"and feature_dropout_rate apply to a DEEP or WIDE group; "
                         f"{group.name!r} is a SEQUENCE group")
    return InputLayerNode([f.dim for f in group.features], options)
