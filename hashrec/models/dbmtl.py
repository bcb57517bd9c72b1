"""DBMTL: deep Bayesian multi-target learning, a multi-task ranking model whose tasks
may read earlier tasks' outputs (a task's ``num_class`` logits a row).

The DEEP feature groups, concatenated in group order (B, D), go through the optional
``mask_net`` (a MaskNet, see ``hashrec.modules.masknet``), then the optional shared
``bottom_mlp``. Each task reads the result, or, with ``expert_mlp``, its gate's
mix of ``num_expert`` experts over it (as MMoE), then its tower's optional ``mlp``. A
task's *tower output* is that, concatenated with the tower outputs of the tasks named in
its ``relation_tower_names`` (earlier tasks, in that order), through its
``relation_mlp``; a linear layer maps it to the task's logit. Without ``relation_mlp``
the relation towers are not read (as in TorchEasyRec; a warning says so): the tower
output is the task's own. The tasks, their labels,
losses and metrics are ``task_towers`` (see ``hashrec.models.tasks``).
"""

import logging

import torch
from torch import nn

from hashrec.models.errors import ModelError
from hashrec.models.group_net import GroupNetModel
from hashrec.models.mask_net import build_mask_net
from hashrec.models.mlp_config import mlp_options, optional_mlp
from hashrec.models.mmoe import MMoETask, check_module_name, deep_groups_merged
from hashrec.modules import MLP, MaskNet

logger = logging.getLogger(__name__)


class SharedInput(nn.Module):
    """A task input without experts: ``forward(features (B, D), experts) -> tower(features)``
    (``experts`` unused; the signature is ``MMoETask``'s)."""

    def __init__(self, tower: nn.Module) -> None:
        super().__init__()
        self.tower = tower

    def forward(self, features: torch.Tensor, experts: torch.Tensor) -> torch.Tensor:
        return self.tower(features)


class DBMTLTask(nn.Module):
    """One task of DBMTL.

    ``forward(features (B, D), experts (B, num_expert, E), outputs) -> tower output
    (B, H)``, ``outputs`` the earlier tasks' tower outputs by tower name; ``logit`` maps
    the tower output to (B, num_class).

    Args:
        task_input: ``MMoETask`` (gate and mlp) or ``SharedInput`` (mlp).
        relations: the tower names whose outputs follow the task's own in the
            relation input.
        relation: the relation MLP (or identity) over that concatenation.
        logit: (B, H) -> (B, num_class).
    """

    # Evaluated, not text (no __future__ annotations here): TorchScript types the
    # attribute from it, even when the list is empty.
    relations: list[str]

    def __init__(self, task_input: nn.Module, relations: list[str], relation: nn.Module,
                 logit: nn.Module) -> None:
        super().__init__()
        self.task_input = task_input
        self.relations = relations
        self.relation = relation
        self.logit = logit

    def forward(self, features: torch.Tensor, experts: torch.Tensor,
                outputs: dict[str, torch.Tensor]) -> torch.Tensor:
        parts = [self.task_input(features, experts)]
        for name in self.relations:
            parts.append(outputs[name])
        return self.relation(torch.cat(parts, dim=-1))


class DBMTLNet(nn.Module):
    """DBMTL's (and DC2VR's) dense network, shared by the eager model and its scripted
    export: each task reads the bottom's output (or the experts) and the earlier tasks'
    tower outputs.

    ``forward([features (B, D)]) -> logits (B, sum of the tasks' num_class)``.

    Args:
        bottom: the mask net, then the shared bottom MLP (either, both in an
            ``nn.Sequential``, or identity), (B, D) -> (B, D').
        experts: the expert MLPs, each (B, D') -> (B, E); empty without experts.
        tasks: tower_name -> ``DBMTLTask`` (or ``DC2VRTask``), in task order (keyed by
            name, so that a fine-tune start restores each task from the checkpoint's task
            of that name); a task has a ``logit`` module.
    """

    def __init__(self, bottom: nn.Module, experts: list[nn.Module],
                 tasks: dict[str, nn.Module]) -> None:
        super().__init__()
        self.bottom = bottom
        self.experts = nn.ModuleList(experts)
        self.has_experts = len(experts) > 0
        self.tasks = nn.ModuleDict(tasks)

    def forward(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        features = self.bottom(inputs[0])
        experts = features.unsqueeze(1)  # read by the tasks' gates only
        if self.has_experts:
            experts = torch.stack([expert(features) for expert in self.experts], dim=1)
        outputs: dict[str, torch.Tensor] = {}
        logits: list[torch.Tensor] = []
        for name, task in self.tasks.items():
            output = task(features, experts, outputs)
            outputs[name] = output
            logits.append(task.logit(output))
        return torch.cat(logits, dim=-1)


class DBMTL(GroupNetModel):
    """See the module docstring; arguments as ``RankModel``.

    Attributes:
        deep_group: the DEEP groups' features as one group (the bottom's input).
    """

    def __init__(self, model_config, feature_set, sparse_optimizer, device=None,
                 embedding: nn.Module | None = None) -> None:
        super().__init__(model_config, feature_set, sparse_optimizer, device, embedding)
        config = model_config.dbmtl
        self.deep_group = deep_groups_merged(self, "dbmtl")
        self.input_groups = [self.deep_group]
        mask_net, width = _mask_net(config, self.deep_group.dim)
        bottom, width = optional_mlp(config, "bottom_mlp", width, "dbmtl.bottom_mlp")
        if mask_net is not None:
            bottom = nn.Sequential(mask_net, bottom) if bottom is not None else mask_net
        experts, input_width = experts_of(config, width, "dbmtl")
        tasks: dict[str, nn.Module] = {}
        widths: dict[str, int] = {}
        for task, tower in zip(self.tasks, config.task_towers):
            check_module_name(task)
            check_earlier_towers(task, list(tower.relation_tower_names),
                                 "relation_tower_names", widths)
            mlp, tower_width = optional_mlp(tower, "mlp", input_width, f"{task.where}.mlp")
            mlp = mlp or nn.Identity()
            task_input = task_input_of(config, experts, width, mlp, "dbmtl")
            relations = _relations(task, tower)
            relation_width = tower_width + sum(widths[n] for n in relations)
            relation, widths[task.name] = optional_mlp(tower, "relation_mlp", relation_width,
                                                       f"{task.where}.relation_mlp")
            tasks[task.name] = DBMTLTask(task_input, relations, relation or nn.Identity(),
                                         nn.Linear(widths[task.name], task.num_class))
        self.net = DBMTLNet(bottom or nn.Identity(), experts, tasks)


def _mask_net(config, width: int) -> tuple[MaskNet | None, int]:
    """The MaskNet of ``config.mask_net`` over ``width`` inputs and its output width, or
    (None, ``width``) where it is unset (errors: ``build_mask_net``)."""
    if not config.HasField("mask_net"):
        return None, width
    net = build_mask_net(config.mask_net, width, "dbmtl.mask_net")
    return net, net.output_dim()


def experts_of(config, width: int, kind: str) -> tuple[list[nn.Module], int]:
    """The expert MLPs of the model ``kind``'s ``config`` over ``width`` inputs (none
    without expert_mlp) and the width of a task's input.

    Raises:
        ModelError: num_expert < 1 with expert_mlp, or gate_mlp without expert_mlp.
    """
    if not config.HasField("expert_mlp"):
        if config.HasField("gate_mlp"):
            raise ModelError(f"{kind}.gate_mlp is set without {kind}.expert_mlp; the gates "
                             f"mix experts: set expert_mlp (and num_expert) or drop gate_mlp")
        return [], width
    if config.num_expert < 1:
        raise ModelError(f"{kind}.num_expert={config.num_expert}; allowed: 1 or more")
    experts = [MLP(width, mlp_options(config.expert_mlp, f"{kind}.expert_mlp"))
               for _ in range(config.num_expert)]
    return experts, experts[0].output_dim()


def task_input_of(config, experts: list[nn.Module], width: int, mlp: nn.Module,
                  kind: str) -> nn.Module:
    """A task's input module: with ``experts``, its gate (the optional ``gate_mlp`` over
    ``width`` inputs, then a linear layer to ``num_expert`` scores) mixing them, then
    ``mlp``; without, ``mlp`` over the shared input."""
    if not experts:
        return SharedInput(mlp)
    gate, gate_width = optional_mlp(config, "gate_mlp", width, f"{kind}.gate_mlp")
    return MMoETask(nn.Sequential(gate or nn.Identity(),
                                  nn.Linear(gate_width, config.num_expert)), mlp)


def _relations(task, tower) -> list[str]:
    """The towers whose outputs the task's relation MLP reads: none without one, as in
    TorchEasyRec (its relation_tower_names then have no effect: said in a warning)."""
    names = list(tower.relation_tower_names)
    if names and not tower.HasField("relation_mlp"):
        logger.warning("%s.relation_tower_names %s: not read without relation_mlp (as in "
                       "TorchEasyRec); the task's logit reads its own tower. Add a "
                       "relation_mlp to feed the task from those towers", task.where, names)
        return []
    return names


def check_earlier_towers(task, names: list[str], field: str, earlier: dict[str, int]) -> None:
    """Each of ``names`` (the tower's field ``field``) names an earlier task
    (``earlier``), once.

    Raises:
        ModelError: the task itself, a later or unknown task, or a name twice.
    """
    for name in names:
        if name in earlier and names.count(name) == 1:
            continue
        if name == task.name:
            why = "is the task itself"
        elif name in earlier:
            why = "is named twice"
        else:
            why = "is not an earlier task (a task reads the towers defined before it)"
        raise ModelError(f"{task.where}.{field}: {name!r} {why}; earlier "
                         f"tasks: {', '.join(earlier) or 'none'}")
