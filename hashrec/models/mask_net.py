"""MaskNet as a ranking model (``mask_net``): a MaskNet over the DEEP feature groups.

The DEEP groups, concatenated in group order (B, D) (TorchEasyRec configs have one
group), go through ``mask_net_module`` (``hashrec.modules.masknet``: ``n_mask_blocks``
instance-guided mask blocks, parallel or serial, then the optional ``top_mlp``), and a
linear layer without bias maps its output to the logit, as in TorchEasyRec; the
prediction is the logit's sigmoid (with classes, the logits' softmax).
"""

from __future__ import annotations

import torch
from torch import nn

from hashrec.models.errors import ModelError
from hashrec.models.group_net import GroupNetModel
from hashrec.models.mlp_config import mlp_options
from hashrec.models.mmoe import deep_groups_merged
from hashrec.modules import MaskBlockOptions
from hashrec.modules import MaskNet as MaskNetModule


def build_mask_net(config, width: int, where: str) -> MaskNetModule:
    """The MaskNet of the ``MaskNetModule`` message ``config`` over ``width`` inputs.

    Raises:
        ModelError: n_mask_blocks, hidden_dim or the aggregation width below 1, or an
            invalid top_mlp; the message names ``where``.
    """
    block = config.mask_block
    top = mlp_options(config.top_mlp, f"{where}.top_mlp") if config.HasField("top_mlp") \
        else None
    try:
        options = MaskBlockOptions(
            hidden_dim=block.hidden_dim, reduction_ratio=block.reduction_ratio,
            aggregation_dim=block.aggregation_dim if block.HasField("aggregation_dim")
            else None)
        return MaskNetModule(width, config.n_mask_blocks, options, top, config.use_parallel)
    except ValueError as err:
        raise ModelError(f"{where}: {err}") from err


class MaskNetNet(nn.Module):
    """MaskNet's dense network, shared by the eager model and its scripted export:
    ``forward([features (B, D)]) -> logits (B,)`` (or (B, num_class))."""

    def __init__(self, mask_net: nn.Module, output: nn.Module) -> None:
        super().__init__()
        self.mask_net = mask_net
        self.output = output

    def forward(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        return self.output(self.mask_net(inputs[0])).squeeze(-1)


class MaskNet(GroupNetModel):
    """See the module docstring; arguments as ``RankModel``.

    Attributes:
        deep_group: the DEEP groups' features as one group (the mask net's input).
        net: the dense network (``MaskNetNet``).
    """

    kind = "mask_net"

    def __init__(self, model_config, feature_set, sparse_optimizer, device=None,
                 embedding: nn.Module | None = None) -> None:
        super().__init__(model_config, feature_set, sparse_optimizer, device, embedding)
        self.deep_group = deep_groups_merged(self, self.kind)
        self.input_groups = [self.deep_group]
        mask_net = build_mask_net(model_config.mask_net.mask_net_module, self.deep_group.dim,
                                  "mask_net.mask_net_module")
        self.net = MaskNetNet(mask_net, nn.Linear(mask_net.output_dim(), self.num_class,
                                                  bias=False))
