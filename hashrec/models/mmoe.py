"""MMoE: multi-gate mixture of experts, a multi-task ranking model (``num_class`` logits a
task, one unless a task has classes).

The DEEP feature groups, concatenated in group order (B, D), feed ``num_expert``
expert MLPs (``expert_mlp`` each) and, per task, a gate: the optional ``gate_mlp``
then a linear layer to ``num_expert`` scores and a softmax over them. A task's input
is its gate's weighted sum of the experts' outputs; it goes through the task tower's
optional ``mlp`` and a linear layer to the task's logit. The tasks, their labels,
losses and metrics are ``task_towers`` (see ``hashrec.models.tasks``); the total loss
is the sum over tasks of ``weight`` times the task's loss.
"""

from __future__ import annotations

import re

import torch
from torch import nn

from hashrec.models.errors import ModelError
from hashrec.models.feature_groups import DEEP
from hashrec.models.group_net import GroupNetModel
from hashrec.models.mlp_config import mlp_options, optional_mlp
from hashrec.models.wide_and_deep import merged_group
from hashrec.modules import MLP

_MODULE_NAME = re.compile(r"[A-Za-z0-9_-]+")


class MMoETask(nn.Module):
    """One task of MMoE: its gate mixes the experts' outputs, its tower makes the logit.

    ``forward(features (B, D), experts (B, num_expert, E)) -> logits (B, num_class)``.

    Args:
        gate: (B, D) -> (B, num_expert) scores (before the softmax).
        tower: (B, E) -> (B, num_class) logits.
    """

    def __init__(self, gate: nn.Module, tower: nn.Module) -> None:
        super().__init__()
        self.gate = gate
        self.tower = tower

    def forward(self, features: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        return self.tower(gate_mix(self.gate(features), experts))


def gate_mix(scores: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
    """A gate's mix of experts: ``scores (B, n), experts (B, n, E) -> (B, E)``, the
    experts weighted by the softmax of the scores."""
    mix = torch.softmax(scores, dim=-1).unsqueeze(-1)  # (B, n, 1)
    return (mix * experts).sum(dim=1)


class MMoENet(nn.Module):
    """MMoE's dense network, shared by the eager model and its scripted export.

    ``forward([features (B, D)]) -> logits (B, sum of the tasks' num_class)``.

    Args:
        experts: the expert MLPs, each (B, D) -> (B, E).
        tasks: tower_name -> ``MMoETask``, in task order. Keyed by name, so that a
            fine-tune start restores each task's gate and tower from the checkpoint's
            task of the same name, whatever the towers' order.
    """

    def __init__(self, experts: list[nn.Module], tasks: dict[str, nn.Module]) -> None:
        super().__init__()
        self.experts = nn.ModuleList(experts)
        self.tasks = nn.ModuleDict(tasks)

    def forward(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        features = inputs[0]
        experts = torch.stack([expert(features) for expert in self.experts], dim=1)
        logits: list[torch.Tensor] = []
        for task in self.tasks.values():
            logits.append(task(features, experts))
        return torch.cat(logits, dim=-1)


class MMoE(GroupNetModel):
    """See the module docstring; arguments as ``RankModel``.

    Attributes:
        deep_group: the DEEP groups' features as one group (the experts' and the
            gates' input).
    """

    def __init__(self, model_config, feature_set, sparse_optimizer, device=None,
                 embedding: nn.Module | None = None) -> None:
        super().__init__(model_config, feature_set, sparse_optimizer, device, embedding)
        config = model_config.mmoe
        self.deep_group = deep_groups_merged(self, "mmoe")
        if config.num_expert < 1:
            raise ModelError(f"mmoe.num_expert={config.num_expert}; allowed: 1 or more")
        self.input_groups = [self.deep_group]
        width = self.deep_group.dim
        experts = [MLP(width, mlp_options(config.expert_mlp, "mmoe.expert_mlp"))
                   for _ in range(config.num_expert)]
        expert_width = experts[0].output_dim()
        tasks = {}
        for task, tower in zip(self.tasks, config.task_towers):
            check_module_name(task)
            gate, gate_width = optional_mlp(config, "gate_mlp", width, "mmoe.gate_mlp")
            tasks[task.name] = MMoETask(
                nn.Sequential(gate or nn.Identity(), nn.Linear(gate_width, config.num_expert)),
                task_tower(task, tower, expert_width))
        self.net = MMoENet(experts, tasks)


def task_tower(task, tower, width: int) -> nn.Module:
    """The tower of ``task`` (its ``TaskTower`` message ``tower``) over ``width`` inputs:
    the optional ``mlp``, then a linear layer to the task's logits, (B, width) ->
    (B, num_class)."""
    mlp, tower_width = optional_mlp(tower, "mlp", width, f"{task.where}.mlp")
    return nn.Sequential(mlp or nn.Identity(), nn.Linear(tower_width, task.num_class))


def deep_groups_merged(model, kind: str):
    """The feature groups of ``model`` as one DEEP group (the input of a multi-task
    model ``kind`` that reads DEEP groups only).

    Raises:
        ModelError: a group that is not DEEP, or no group.
    """
    other = [g.name for g in model.groups.values() if g.group_type != DEEP]
    if other or not model.groups:
        raise ModelError(f"{kind} reads DEEP feature groups only (got {other or 'none'}); "
                         f"make every feature group DEEP")
    return merged_group(kind, DEEP, list(model.groups.values()))


def check_module_name(task) -> None:
    """A tower_name names the task's module (its state_dict keys, its attribute in the
    scripted export): letters, digits, _ and -, and no attribute of nn.ModuleDict."""
    if not _MODULE_NAME.fullmatch(task.name) or hasattr(nn.ModuleDict(), task.name):
        raise ModelError(f"{task.where}.tower_name {task.name!r} cannot name the task's "
                         f"module; use letters, digits, _ and - (and no name of torch's "
                         f"nn.ModuleDict attributes, such as keys or training)")
