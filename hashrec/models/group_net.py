"""Ranking models whose dense network reads whole feature groups as a list of inputs.

WideAndDeep, DeepFM and DLRM concatenate each of a few feature groups (DEEP, or
WIDE) into one (B, width) input, in the order of ``input_groups``, and hand the
list to a scriptable network ``net``; the CUDA graphs capture ``net`` over those
fixed-shape inputs and the scripted export runs the same ``net`` on the same
groups (``hashrec.export.scripted.heads``).
"""

from __future__ import annotations

import torch
from torch import nn

from hashrec.models.feature_groups import GroupSpec
from hashrec.models.rank_model import RankModel


class GroupNetModel(RankModel):
    """Subclasses set ``input_groups`` (list of GroupSpec, each a DEEP or WIDE group or
    several merged) and ``net`` (``forward(inputs: list[Tensor]) -> logits (B,)``)."""

    input_groups: list[GroupSpec]
    net: nn.Module

    def dense_inputs(self, embedded, batch) -> tuple[torch.Tensor, ...]:
        """Each of ``input_groups`` concatenated, (B, its width); a group with sequence
        encoders as the tensors they read (``RankModel.group_inputs``)."""
        return self.group_inputs(self.input_groups, embedded, batch)

    def dense_from_inputs(self, *inputs: torch.Tensor) -> torch.Tensor:
        """``dense_inputs`` -> logits (see ``RankModel.dense_from_inputs``)."""
        return self.net(self.groups_from_inputs(self.input_groups, inputs))
