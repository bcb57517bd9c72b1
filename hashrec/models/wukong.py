"""WuKong: stacked WuKong layers (``hashrec.modules.wukong``) over the sparse embeddings
and the dense MLP's output, then the final MLP and the logit.

Groups as DLRM's (``hashrec.models.sparse_dense``): one DEEP group is the sparse part;
with two, the group ``sparse`` is and the group ``dense`` feeds ``dense_mlp``, whose last
hidden unit must be the sparse features' width d. The sparse group's N features must all
have width d.

The rows, the dense MLP's output first (where there is a dense group) and then the N
embeddings, F rows of d columns, go through each of ``wukong_layers`` in order, layer l
writing ``fmb_feature_num + lcb_feature_num`` rows for the next; the last rows, flattened,
go through ``final`` and a linear layer to the logit, whose sigmoid is the prediction
(softmax of ``num_class`` logits with classes), as in TorchEasyRec.
"""

from __future__ import annotations

import torch
from torch import nn

from hashrec.models.errors import ModelError
from hashrec.models.group_net import GroupNetModel
from hashrec.models.mlp_config import mlp_options
from hashrec.models.sparse_dense import (
    dense_mlp_to_width,
    sparse_and_dense_groups,
    sparse_width,
)
from hashrec.modules import MLP, WuKongLayer

# How WuKong's rows meet, for the width errors.
_ROWS = "are rows of one matrix"


class WuKongNet(nn.Module):
    """WuKong's dense network, shared by the eager model and its scripted export.

    ``forward([sparse (B, N * d)] or [sparse, dense (B, Dd)]) -> logits (B,)`` (or
    (B, num_class)); ``dense`` is there with a dense group only.

    Args:
        num_sparse: N.
        dense_mlp: the dense MLP, or None without a dense group.
        layers: the WuKong layers, in order.
        final: the final MLP over the last layer's rows, flattened.
        output: the linear layer to the logits.
    """

    def __init__(self, num_sparse: int, dense_mlp: nn.Module | None, layers: nn.ModuleList,
                 final: nn.Module, output: nn.Module) -> None:
        super().__init__()
        self.num_sparse = num_sparse
        self.has_dense = dense_mlp is not None
        self.dense_mlp = dense_mlp if dense_mlp is not None else nn.Identity()
        self.layers = layers
        self.final = final
        self.output = output

    def forward(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        sparse = inputs[0]
        rows = sparse.reshape(sparse.shape[0], self.num_sparse, -1)
        if self.has_dense:
            rows = torch.cat([self.dense_mlp(inputs[1]).unsqueeze(1), rows], dim=1)
        for layer in self.layers:
            rows = layer(rows)
        return self.output(self.final(rows.flatten(1))).squeeze(-1)


class WuKong(GroupNetModel):
    """See the module docstring; arguments as ``RankModel``. The dense network's inputs
    (``input_groups``) are the sparse group and, where there is one, the dense group.

    Attributes:
        sparse_group: the sparse group.
        dense_group: the dense group, or None.
        net: the dense network (``WuKongNet``).
    """

    kind = "wukong"

    def __init__(self, model_config, feature_set, sparse_optimizer, device=None,
                 embedding: nn.Module | None = None) -> None:
        super().__init__(model_config, feature_set, sparse_optimizer, device, embedding)
        config = model_config.wukong
        self.sparse_group, self.dense_group = sparse_and_dense_groups(self)
        self.input_groups = [self.sparse_group] + (
            [self.dense_group] if self.dense_group is not None else [])
        width = sparse_width(self, _ROWS)
        dense_mlp = dense_mlp_to_width(self, config, width, _ROWS)
        rows = len(self.sparse_group.features) + int(dense_mlp is not None)
        layers = nn.ModuleList()
        for i, layer_config in enumerate(config.wukong_layers):
            layer = _layer(layer_config, width, rows, f"{self.kind}.wukong_layers[{i}]")
            layers.append(layer)
            rows = layer.output_rows()
        final = MLP(rows * width, mlp_options(config.final, f"{self.kind}.final"))
        self.net = WuKongNet(len(self.sparse_group.features), dense_mlp, layers, final,
                             nn.Linear(final.output_dim(), self.num_class))


def _layer(config, width: int, rows: int, where: str) -> WuKongLayer:
    """The WuKong layer of the ``WuKongLayer`` message ``config`` over ``rows`` rows of
    ``width`` columns; a bad count is a ModelError naming ``where``."""
    mlp = mlp_options(config.feature_num_mlp, f"{where}.feature_num_mlp")
    try:
        return WuKongLayer(width, rows, config.lcb_feature_num, config.fmb_feature_num,
                           config.compressed_feature_num, mlp)
    except ValueError as err:
        raise ModelError(f"{where}: {err}") from err
