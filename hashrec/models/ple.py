"""PLE: progressive layered extraction, a multi-task ranking model (``num_class`` logits a
task).

The DEEP feature groups, concatenated in group order (B, D), are the first level's
input of every task and of the shared branch. Each level (``extraction_networks``) has,
per task, ``expert_num_per_task`` experts (``task_expert_net``) over the task's input,
and ``share_num`` shared experts (``share_expert_net``) over the shared input. A task's
gate, a linear layer over the task's input and a softmax, mixes the task's own experts
and the shared experts: that mix is the task's input at the next level. Every level but
the last also has a shared gate over the shared input that mixes all the level's
experts (every task's, then the shared ones): the next level's shared input (left out
where no later level has shared experts, as nothing would read it). After the
last level a task's mix goes through its tower's optional ``mlp`` and a linear layer to
the task's logit, as in MMoE. The tasks, their labels, losses and metrics are
``task_towers`` (see ``hashrec.models.tasks``).
"""

import torch
from torch import nn

from hashrec.models.errors import ModelError
from hashrec.models.group_net import GroupNetModel
from hashrec.models.mlp_config import mlp_options
from hashrec.models.mmoe import check_module_name, deep_groups_merged, gate_mix, task_tower
from hashrec.modules import MLP


class PLETaskExperts(nn.Module):
    """One task's part of an extraction level: its experts and its gate.

    ``forward(features (B, D), shared [(B, E)] * share_num) -> (own [(B, E)] *
    expert_num_per_task, mix (B, E))``, ``mix`` the gate's softmax-weighted sum of the
    task's own experts and the shared experts.

    Args:
        experts: the task's expert MLPs, each (B, D) -> (B, E).
        gate: (B, D) -> (B, expert_num_per_task + share_num) scores.
    """

    def __init__(self, experts: list[nn.Module], gate: nn.Module) -> None:
        super().__init__()
        self.experts = nn.ModuleList(experts)
        self.gate = gate

    def forward(self, features: torch.Tensor, shared: list[torch.Tensor]
                ) -> tuple[list[torch.Tensor], torch.Tensor]:
        own: list[torch.Tensor] = []
        for expert in self.experts:
            own.append(expert(features))
        return own, gate_mix(self.gate(features), torch.stack(own + shared, dim=1))


class ExtractionLevel(nn.Module):
    """One extraction level of PLE.

    ``forward(inputs [(B, D)] * tasks, shared (B, D_s)) -> (outputs [(B, E)] * tasks,
    shared (B, E))``; without a shared gate the shared input passes through (no later
    level reads it).

    Args:
        tasks: tower_name -> ``PLETaskExperts``, in task order.
        shared_experts: the shared expert MLPs, each (B, D_s) -> (B, E); may be empty.
        shared_gate: (B, D_s) -> (B, tasks * expert_num_per_task + share_num) scores, or
            None where no later level has shared experts (the last level, say).
    """

    def __init__(self, tasks: dict[str, nn.Module], shared_experts: list[nn.Module],
                 shared_gate: nn.Module | None) -> None:
        super().__init__()
        self.tasks = nn.ModuleDict(tasks)
        self.shared_experts = nn.ModuleList(shared_experts)
        self.has_shared_gate = shared_gate is not None
        self.shared_gate = shared_gate or nn.Identity()

    def forward(self, inputs: list[torch.Tensor], shared: torch.Tensor
                ) -> tuple[list[torch.Tensor], torch.Tensor]:
        shared_outputs: list[torch.Tensor] = []
        for expert in self.shared_experts:
            shared_outputs.append(expert(shared))
        experts: list[torch.Tensor] = []
        outputs: list[torch.Tensor] = []
        i = 0
        for task in self.tasks.values():
            own, output = task(inputs[i], shared_outputs)
            experts.extend(own)
            outputs.append(output)
            i += 1
        if self.has_shared_gate:
            shared = gate_mix(self.shared_gate(shared),
                              torch.stack(experts + shared_outputs, dim=1))
        return outputs, shared


class PLENet(nn.Module):
    """PLE's dense network, shared by the eager model and its scripted export.

    ``forward([features (B, D)]) -> logits (B, sum of the tasks' num_class)``.

    Args:
        levels: the ``ExtractionLevel`` modules, first to last.
        towers: tower_name -> the task's tower, (B, E) -> (B, num_class), in task order.
    """

    def __init__(self, levels: list[nn.Module], towers: dict[str, nn.Module]) -> None:
        super().__init__()
        self.levels = nn.ModuleList(levels)
        self.towers = nn.ModuleDict(towers)

    def forward(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        shared = inputs[0]
        features: list[torch.Tensor] = []
        for _ in range(len(self.towers)):
            features.append(shared)
        for level in self.levels:
            features, shared = level(features, shared)
        logits: list[torch.Tensor] = []
        i = 0
        for tower in self.towers.values():
            logits.append(tower(features[i]))
            i += 1
        return torch.cat(logits, dim=-1)


class PLE(GroupNetModel):
    """See the module docstring; arguments as ``RankModel``.

    Attributes:
        deep_group: the DEEP groups' features as one group (the first level's input).
    """

    def __init__(self, model_config, feature_set, sparse_optimizer, device=None,
                 embedding: nn.Module | None = None) -> None:
        super().__init__(model_config, feature_set, sparse_optimizer, device, embedding)
        config = model_config.ple
        self.deep_group = deep_groups_merged(self, "ple")
        self.input_groups = [self.deep_group]
        for task in self.tasks:
            check_module_name(task)
        _check_networks(config.extraction_networks)
        networks = list(config.extraction_networks)
        width = shared_width = self.deep_group.dim
        levels = []
        for i, network in enumerate(networks):
            # The shared gate's mix is read by later shared experts (and gates) only.
            shared_gate = any(later.share_num > 0 for later in networks[i + 1:])
            level, width, shared_width = _level(network, self.tasks, width, shared_width,
                                                shared_gate)
            levels.append(level)
        towers = {task.name: task_tower(task, tower, width)
                  for task, tower in zip(self.tasks, config.task_towers)}
        self.net = PLENet(levels, towers)


def _check_networks(networks) -> None:
    """The extraction levels' names and expert counts can build a PLE.

    Raises:
        ModelError: no level, a level without a name or with another's name,
            expert_num_per_task 0, or share_num > 0 without share_expert_net.
    """
    if not networks:
        raise ModelError("ple has no extraction_networks; add one (network_name, "
                         "expert_num_per_task, task_expert_net) per level")
    names: list[str] = []
    for network in networks:
        where = f"ple.extraction_networks[{network.network_name!r}]"
        if not network.network_name:
            raise ModelError("ple.extraction_networks: a level has an empty network_name")
        if network.network_name in names:
            raise ModelError(f"{where} is defined twice; network names must be unique")
        names.append(network.network_name)
        if network.expert_num_per_task < 1:
            raise ModelError(f"{where}.expert_num_per_task={network.expert_num_per_task}; "
                             f"allowed: 1 or more")
        if network.share_num > 0 and not network.HasField("share_expert_net"):
            raise ModelError(f"{where}.share_num={network.share_num} without "
                             f"share_expert_net; set share_expert_net or share_num: 0")


def _level(network, tasks, width: int, shared_width: int, shared_gate: bool):
    """The extraction level of the ``ExtractionNetwork`` message ``network`` over task
    inputs of ``width`` and a shared input of ``shared_width`` columns, with a shared
    gate if ``shared_gate``: (the ``ExtractionLevel``, its task outputs' width, its
    shared output's width).

    Raises:
        ModelError: invalid MLP options, or task and shared experts of two widths.
    """
    where = f"ple.extraction_networks[{network.network_name!r}]"
    task_options = mlp_options(network.task_expert_net, f"{where}.task_expert_net")
    per_task = network.expert_num_per_task
    gate_width = per_task + network.share_num
    experts = {task.name: PLETaskExperts([MLP(width, task_options) for _ in range(per_task)],
                                         nn.Linear(width, gate_width))
               for task in tasks}
    expert_width = next(iter(experts.values())).experts[0].output_dim()
    shared: list[nn.Module] = []
    if network.share_num > 0:
        shared_options = mlp_options(network.share_expert_net, f"{where}.share_expert_net")
        shared = [MLP(shared_width, shared_options) for _ in range(network.share_num)]
        if shared[0].output_dim() != expert_width:
            raise ModelError(f"{where}: share_expert_net's output width "
                             f"{shared[0].output_dim()} differs from task_expert_net's "
                             f"{expert_width}; the gates mix both: make the last "
                             f"hidden_units equal")
    if not shared_gate:
        return ExtractionLevel(experts, shared, None), expert_width, shared_width
    gate = nn.Linear(shared_width, len(tasks) * per_task + network.share_num)
    return ExtractionLevel(experts, shared, gate), expert_width, expert_width
