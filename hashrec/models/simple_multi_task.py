"""SimpleMultiTask: a multi-task ranking model whose task towers share only the inputs.

The DEEP feature groups, concatenated in group order (B, D), are every task's input: a
task's tower is its optional ``mlp`` and a linear layer to its ``num_class`` logits
(one unless the task has classes). The tasks, their labels, losses and metrics are
``task_towers`` (see ``hashrec.models.tasks``); the total loss is the sum over tasks of
``weight`` times the task's loss.
"""

from __future__ import annotations

import torch
from torch import nn

from hashrec.models.group_net import GroupNetModel
from hashrec.models.mmoe import check_module_name, deep_groups_merged, task_tower


class SimpleMultiTaskNet(nn.Module):
    """SimpleMultiTask's dense network, shared by the eager model and its scripted export.

    ``forward([features (B, D)]) -> logits (B, sum of the tasks' num_class)``.

    Args:
        towers: tower_name -> the task's tower, (B, D) -> (B, num_class), in task order
            (keyed by name, so that a fine-tune start restores each task's tower from the
            checkpoint's task of that name).
    """

    def __init__(self, towers: dict[str, nn.Module]) -> None:
        super().__init__()
        self.towers = nn.ModuleDict(towers)

    def forward(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        features = inputs[0]
        logits: list[torch.Tensor] = []
        for tower in self.towers.values():
            logits.append(tower(features))
        return torch.cat(logits, dim=-1)


class SimpleMultiTask(GroupNetModel):
    """See the module docstring; arguments as ``RankModel``.

    Attributes:
        deep_group: the DEEP groups' features as one group (every tower's input).
        net: the dense network (``SimpleMultiTaskNet``).
    """

    kind = "simple_multi_task"

    def __init__(self, model_config, feature_set, sparse_optimizer, device=None,
                 embedding: nn.Module | None = None) -> None:
        super().__init__(model_config, feature_set, sparse_optimizer, device, embedding)
        config = model_config.simple_multi_task
        self.deep_group = deep_groups_merged(self, self.kind)
        self.input_groups = [self.deep_group]
        towers = {}
        for task, tower in zip(self.tasks, config.task_towers):
            check_module_name(task)
            towers[task.name] = task_tower(task, tower, self.deep_group.dim)
        self.net = SimpleMultiTaskNet(towers)
