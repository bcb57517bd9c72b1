"""DCN v1 and DCN v2: a cross network beside a deep MLP, then a final MLP and the logit.

Both read the DEEP feature groups, concatenated in group order, x_0 (B, D) (TorchEasyRec
configs have one group). The cross networks are ``hashrec.modules.cross``.

- DCN v1 (``dcn_v1``): ``cross_tower`` (``Cross``, ``cross_num`` layers) and the
  ``deep_tower`` MLP both read x_0; their outputs, concatenated (D + deep width), go
  through ``final_dnn`` and a linear layer without bias to the logit.
- DCN v2 (``dcn_v2``): the optional ``backbone`` MLP over x_0 feeds ``cross``
  (``CrossV2``, ``cross_num`` layers of rank ``low_rank``); the optional ``deep`` MLP
  reads x_0 itself; the cross output, then the deep output where there is one, go
  through ``final`` and a linear layer without bias to the logit.

The prediction is the logit's sigmoid (with classes, the logits' softmax), as in
TorchEasyRec.
"""

from __future__ import annotations

import torch
from torch import nn

from hashrec.models.errors import ModelError
from hashrec.models.group_net import GroupNetModel
from hashrec.models.mlp_config import mlp_options, optional_mlp
from hashrec.models.mmoe import deep_groups_merged
from hashrec.modules import MLP, Cross, CrossV2


class CrossDeepNet(nn.Module):
    """The dense network of DCN v1 and v2, shared by the eager model and its scripted
    export: ``forward([x_0 (B, D)]) -> logits (B,)`` (or (B, num_class)).

    Args:
        backbone: the MLP before the cross network (identity for none).
        cross: the cross network.
        deep: the deep MLP over x_0, or None.
        final: the final MLP over [cross output, deep output].
        output: the linear layer to the logits.
    """

    def __init__(self, backbone: nn.Module, cross: nn.Module, deep: nn.Module | None,
                 final: nn.Module, output: nn.Module) -> None:
        super().__init__()
        self.backbone = backbone
        self.cross = cross
        self.has_deep = deep is not None
        self.deep = deep if deep is not None else nn.Identity()
        self.final = final
        self.output = output

    def forward(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        features = inputs[0]
        parts = [self.cross(self.backbone(features))]
        if self.has_deep:
            parts.append(self.deep(features))
        return self.output(self.final(torch.cat(parts, dim=-1))).squeeze(-1)


def cross_module(make, width: int, where: str, **options) -> nn.Module:
    """``make(width, **options)`` (a cross network), its ValueError a ModelError naming
    ``where``."""
    try:
        return make(width, **options)
    except ValueError as err:
        raise ModelError(f"{where}: {err}") from err


class DCNV1(GroupNetModel):
    """See the module docstring; arguments as ``RankModel``.

    Attributes:
        deep_group: the DEEP groups' features as one group (x_0).
        net: the dense network (``CrossDeepNet``).
    """

    kind = "dcn_v1"

    def __init__(self, model_config, feature_set, sparse_optimizer, device=None,
                 embedding: nn.Module | None = None) -> None:
        super().__init__(model_config, feature_set, sparse_optimizer, device, embedding)
        config = model_config.dcn_v1
        self.deep_group = deep_groups_merged(self, self.kind)
        self.input_groups = [self.deep_group]
        width = self.deep_group.dim
        cross = cross_module(Cross, width, "dcn_v1.cross_tower",
                             cross_num=config.cross_tower.cross_num)
        deep = MLP(width, mlp_options(config.deep_tower, "dcn_v1.deep_tower"))
        final = MLP(cross.output_dim() + deep.output_dim(),
                    mlp_options(config.final_dnn, "dcn_v1.final_dnn"))
        self.net = CrossDeepNet(nn.Identity(), cross, deep, final,
                                nn.Linear(final.output_dim(), self.num_class, bias=False))


class DCNV2(GroupNetModel):
    """See the module docstring; arguments as ``RankModel``.

    Attributes:
        deep_group: the DEEP groups' features as one group (x_0).
        net: the dense network (``CrossDeepNet``).
    """

    kind = "dcn_v2"

    def __init__(self, model_config, feature_set, sparse_optimizer, device=None,
                 embedding: nn.Module | None = None) -> None:
        super().__init__(model_config, feature_set, sparse_optimizer, device, embedding)
        config = model_config.dcn_v2
        self.deep_group = deep_groups_merged(self, self.kind)
        self.input_groups = [self.deep_group]
        width = self.deep_group.dim
        backbone, cross_width = optional_mlp(config, "backbone", width, "dcn_v2.backbone")
        cross = cross_module(CrossV2, cross_width, "dcn_v2.cross",
                             cross_num=config.cross.cross_num,
                             low_rank=config.cross.low_rank)
        deep, deep_width = optional_mlp(config, "deep", width, "dcn_v2.deep")
        final = MLP(cross.output_dim() + (deep_width if deep is not None else 0),
                    mlp_options(config.final, "dcn_v2.final"))
        self.net = CrossDeepNet(backbone or nn.Identity(), cross, deep, final,
                                nn.Linear(final.output_dim(), self.num_class, bias=False))
