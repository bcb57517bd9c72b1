"""xDeepFM: a compressed interaction network (CIN) beside a deep MLP.

The WIDE feature groups' features are embedded in wide tables of
``wide_embedding_dim`` columns, as WideAndDeep's (``hashrec.features.wide``); their N
embeddings, in group order, are the CIN's input (B, N, wide_embedding_dim)
(``hashrec.modules.cin``, layers of ``cin.cin_layer_size`` feature maps). The DEEP
groups, concatenated in group order, go through the ``deep`` MLP. The CIN output and
the deep output, concatenated, go through ``final`` and a linear layer to the logit;
there is no separate wide logit, as in TorchEasyRec. The prediction is the logit's
sigmoid (with classes, the logits' softmax).
"""

from __future__ import annotations

import torch
from torch import nn

from hashrec.models.errors import ModelError
from hashrec.models.feature_groups import DEEP, WIDE
from hashrec.models.group_net import GroupNetModel
from hashrec.models.mlp_config import mlp_options
from hashrec.models.wide_and_deep import merged_group, split_wide_deep
from hashrec.modules import CIN, MLP


class XDeepFMNet(nn.Module):
    """xDeepFM's dense network, shared by the eager model and its scripted export:
    ``forward([wide (B, N * d), deep (B, D)]) -> logits (B,)`` (or (B, num_class)).

    Args:
        num_features: N, the wide features.
        cin: the CIN over (B, N, d).
        deep: the deep MLP.
        final: the final MLP over [CIN output, deep output].
        output: the linear layer to the logits.
    """

    def __init__(self, num_features: int, cin: nn.Module, deep: nn.Module,
                 final: nn.Module, output: nn.Module) -> None:
        super().__init__()
        self.num_features = num_features
        self.cin = cin
        self.deep = deep
        self.final = final
        self.output = output

    def forward(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        wide, deep = inputs[0], inputs[1]
        crossed = self.cin(wide.reshape(wide.shape[0], self.num_features, -1))
        hidden = torch.cat([crossed, self.deep(deep)], dim=-1)
        return self.output(self.final(hidden)).squeeze(-1)


class XDeepFM(GroupNetModel):
    """See the module docstring; arguments as ``RankModel``. The dense network's inputs
    (``input_groups``) are the wide group and the deep group.

    Attributes:
        wide_group: the WIDE groups' features as one group (the CIN's input).
        deep_group: the DEEP groups' features as one group (the deep MLP's input).
        net: the dense network (``XDeepFMNet``).
    """

    kind = "xdeepfm"

    def __init__(self, model_config, feature_set, sparse_optimizer, device=None,
                 embedding: nn.Module | None = None) -> None:
        super().__init__(model_config, feature_set, sparse_optimizer, device, embedding)
        config = model_config.xdeepfm
        wide, deep = split_wide_deep(self.groups, self.kind, wide_part="the CIN's input")
        self.wide_group = merged_group("wide", WIDE, wide)
        self.deep_group = merged_group("deep", DEEP, deep)
        self.input_groups = [self.wide_group, self.deep_group]
        # Every wide embedding has wide_embedding_dim columns (hashrec.features.wide).
        num_features = len(self.wide_group.features)
        try:
            cin = CIN(num_features, list(config.cin.cin_layer_size))
        except ValueError as err:
            raise ModelError(f"xdeepfm.cin: {err}") from err
        deep_mlp = MLP(self.deep_group.dim, mlp_options(config.deep, "xdeepfm.deep"))
        final = MLP(cin.output_dim() + deep_mlp.output_dim(),
                    mlp_options(config.final, "xdeepfm.final"))
        self.net = XDeepFMNet(num_features, cin, deep_mlp, final,
                              nn.Linear(final.output_dim(), self.num_class))
