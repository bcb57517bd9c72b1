"""Ranking models over TorchEasyRec's configurable backbone (``hashrec.models.backbone``).

- ``rank_backbone { backbone { ... } }``: the backbone's output (one (B, D) tensor)
  through a linear layer to ``num_class`` logits, as TorchEasyRec's RankBackbone.
- ``multi_task_backbone { backbone { ... } model_params { task_towers ... } }``: each task
  tower (its optional ``mlp``, then a linear layer to its ``num_class`` logits) reads the
  backbone's output, or, where the backbone gives a list (``output_blocks``, an ``MMoE``
  module), the list's element of the tower's position, as TorchEasyRec's
  MultiTaskBackbone. The towers' labels, losses and metrics are those of the other
  multi-task models (``hashrec.models.tasks``).

The dense network's inputs are the feature groups the blocks read, in the order they
are first read: (B, D) for a DEEP or WIDE group (its sequence encoders' outputs among its
columns), (query, sequence, lengths) for a SEQUENCE group.
"""

from __future__ import annotations

import torch
from torch import nn

from hashrec.models.backbone.dag import build_backbone
from hashrec.models.backbone.lambdas import LIST
from hashrec.models.errors import ModelError
from hashrec.models.feature_groups import SEQUENCE, sequence_input
from hashrec.models.group_encoders import input_count
from hashrec.models.mmoe import check_module_name, task_tower
from hashrec.models.rank_model import RankModel


class BackboneHeadNet(nn.Module):
    """The backbone, then the heads: ``forward(inputs) -> logits`` (B,) or (B, C) of a
    single-task model, (B, the tasks' logits) of a multi-task one.

    Args:
        backbone: the ``BackboneNet``.
        heads: a linear layer (single task) or each task's tower, in task order.
        per_task: head i reads the backbone's output i (else all read output 0).
        multi_task: concatenate the heads' logits (else squeeze the one head's).
    """

    def __init__(self, backbone: nn.Module, heads: list[nn.Module], per_task: bool,
                 multi_task: bool) -> None:
        super().__init__()
        self.backbone = backbone
        self.heads = nn.ModuleList(heads)
        self.per_task = per_task
        self.multi_task = multi_task

    def forward(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        out = self.backbone(inputs)
        logits: list[torch.Tensor] = []
        for i, head in enumerate(self.heads):
            logits.append(head(out[i] if self.per_task else out[0]))
        if self.multi_task:
            return torch.cat(logits, dim=-1)
        return logits[0].squeeze(-1)


class RankBackbone(RankModel):
    """See the module docstring; arguments as ``RankModel``.

    Attributes:
        input_groups: the feature groups the backbone reads, in input order.
        net: the dense network (``BackboneHeadNet``).
    """

    kind = "rank_backbone"

    def __init__(self, model_config, feature_set, sparse_optimizer, device=None,
                 embedding: nn.Module | None = None) -> None:
        super().__init__(model_config, feature_set, sparse_optimizer, device, embedding)
        config = getattr(model_config, self.kind)
        where = f"model_config.{self.kind}.backbone"
        backbone, used, example = build_backbone(config.backbone, self.groups, where)
        self.input_groups = [self.groups[name] for name in used]
        heads, per_task = self._heads(config, example, where)
        self.net = BackboneHeadNet(backbone, heads, per_task, self.multi_task)

    def _heads(self, config, example, where: str) -> tuple[list[nn.Module], bool]:
        if example.kind == LIST:
            raise ModelError(f"{where}: the backbone gives a list of {len(example.tensors)} "
                             f"outputs; rank_backbone needs one: use concat_blocks")
        return [nn.Linear(_width(example.tensors[0], where), self.num_class)], False

    def dense_inputs(self, embedded, batch) -> tuple[torch.Tensor, ...]:
        """Each input group's tensors (see ``backbone_inputs``)."""
        return tuple(backbone_inputs(self, self.input_groups, embedded, batch))

    def dense_from_inputs(self, *inputs: torch.Tensor) -> torch.Tensor:
        """``dense_inputs`` -> logits (see ``RankModel.dense_from_inputs``)."""
        return self.net(backbone_net_inputs(self, self.input_groups, inputs))


def backbone_inputs(model: RankModel, groups, embedded, batch) -> list[torch.Tensor]:
    """The tensors of the backbone input ``groups``: a SEQUENCE group's three, a DEEP or
    WIDE group's ``group_inputs`` (one, or more where it has sequence encoders)."""
    out: list[torch.Tensor] = []
    for group in groups:
        if group.group_type == SEQUENCE:
            out.extend(sequence_input(group, embedded, batch))
        else:
            out.extend(model.group_inputs([group], embedded, batch))
    return out


def backbone_input_count(model: RankModel, groups) -> int:
    """How many tensors ``backbone_inputs`` gives for ``groups``."""
    return sum(3 if group.group_type == SEQUENCE else input_count(group, model.sequence_encoders)
               for group in groups)


def backbone_net_inputs(model: RankModel, groups, inputs) -> list[torch.Tensor]:
    """``backbone_inputs`` -> the backbone network's inputs: each DEEP or WIDE group's
    tensors made its (B, D), its sequence encoders run; a SEQUENCE group's as they are."""
    net_inputs: list[torch.Tensor] = []
    at = 0
    for group in groups:
        if group.group_type == SEQUENCE:
            net_inputs.extend(inputs[at:at + 3])
            at += 3
            continue
        count = input_count(group, model.sequence_encoders)
        net_inputs.extend(model.groups_from_inputs([group], inputs[at:at + count]))
        at += count
    return net_inputs


class MultiTaskBackbone(RankBackbone):
    """See the module docstring; arguments as ``RankModel``."""

    kind = "multi_task_backbone"

    def _heads(self, config, example, where: str) -> tuple[list[nn.Module], bool]:
        towers = list(config.task_towers)
        per_task = example.kind == LIST
        if per_task and len(example.tensors) != len(towers):
            raise ModelError(f"{where}: the backbone gives {len(example.tensors)} outputs "
                             f"for {len(towers)} task towers; give one per tower, or one "
                             f"for all (concat_blocks)")
        heads = []
        for i, (task, tower) in enumerate(zip(self.tasks, towers)):
            check_module_name(task)
            width = _width(example.tensors[i if per_task else 0], where)
            heads.append(task_tower(task, tower, width))
        return heads, per_task


def _width(tensor: torch.Tensor, where: str) -> int:
    if tensor.dim() != 2:
        raise ModelError(f"{where}: its output is B x {' x '.join(map(str, tensor.shape[1:]))}"
                         f"; the heads read (B, D): flatten it (a lambda block "
                         f"'lambda x: x.flatten(1)')")
    return int(tensor.shape[-1])
