"""DC2VR: a multi-task ranking model whose towers may intervene on each other's
representations (TorchEasyRec's DC2VR, "deconfounding conversion rate").

The DEEP feature groups, concatenated in group order (B, D), go through the optional
shared ``bottom_mlp``. Each task reads the result, or, with ``expert_mlp``, its gate's mix
of ``num_expert`` experts over it (as MMoE), then its tower's optional ``mlp``: the task's
*net*. A tower with ``low_rank_dim`` r intervenes on its net (the base) with the mean of
the tower outputs of the tasks named in its ``intervention_tower_names`` (the source;
earlier tasks, all of one width), see ``hashrec.modules.intervention``; the result is its
tower output, which later tasks may read in turn. A tower without ``low_rank_dim``
outputs its net. A linear layer maps a task's tower output to its ``num_class`` logits.
The tasks, their labels, losses and metrics are ``task_towers`` (see
``hashrec.models.tasks``).

As in TorchEasyRec, ``intervention_tower_names`` are not read without ``low_rank_dim``
(a warning says so), and a tower's ``dropout_ratio`` is never applied (noted and unused).
"""

import logging

import torch
from torch import nn

from hashrec.models.dbmtl import DBMTLNet, check_earlier_towers, experts_of, task_input_of
from hashrec.models.errors import ModelError
from hashrec.models.group_net import GroupNetModel
from hashrec.models.mlp_config import optional_mlp
from hashrec.models.mmoe import check_module_name, deep_groups_merged
from hashrec.modules import Intervention

logger = logging.getLogger(__name__)

KIND = "dc2vr"


class NoIntervention(nn.Module):
    """A tower without intervention: ``forward(base, source) -> base``."""

    def forward(self, base: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        return base


class DC2VRTask(nn.Module):
    """One task of DC2VR.

    ``forward(features (B, D), experts (B, num_expert, E), outputs) -> tower output
    (B, H)``, ``outputs`` the earlier tasks' tower outputs by tower name; ``logit`` maps
    the tower output to (B, num_class).

    Args:
        task_input: ``MMoETask`` (gate and mlp) or ``SharedInput`` (mlp): the task's net.
        sources: the tower names whose outputs, averaged, are the intervention's source
            (empty: the net is the tower output).
        intervention: ``Intervention`` over (net, source), or ``NoIntervention``.
        logit: (B, H) -> (B, num_class).
    """

    # Evaluated, not text (no __future__ annotations here): TorchScript types the
    # attribute from it, even when the list is empty.
    sources: list[str]

    def __init__(self, task_input: nn.Module, sources: list[str], intervention: nn.Module,
                 logit: nn.Module) -> None:
        super().__init__()
        self.task_input = task_input
        self.sources = sources
        self.intervention = intervention
        self.logit = logit

    def forward(self, features: torch.Tensor, experts: torch.Tensor,
                outputs: dict[str, torch.Tensor]) -> torch.Tensor:
        net = self.task_input(features, experts)
        if len(self.sources) == 0:
            return net
        source = torch.stack([outputs[name] for name in self.sources], dim=0).mean(dim=0)
        return self.intervention(net, source)


class DC2VR(GroupNetModel):
    """See the module docstring; arguments as ``RankModel``.

    Attributes:
        deep_group: the DEEP groups' features as one group (the bottom's input).
        net: the dense network (``DBMTLNet`` of ``DC2VRTask``s).
    """

    def __init__(self, model_config, feature_set, sparse_optimizer, device=None,
                 embedding: nn.Module | None = None) -> None:
        super().__init__(model_config, feature_set, sparse_optimizer, device, embedding)
        config = model_config.dc2vr
        self.deep_group = deep_groups_merged(self, KIND)
        self.input_groups = [self.deep_group]
        bottom, width = optional_mlp(config, "bottom_mlp", self.deep_group.dim,
                                     f"{KIND}.bottom_mlp")
        experts, input_width = experts_of(config, width, KIND)
        tasks: dict[str, nn.Module] = {}
        widths: dict[str, int] = {}
        for task, tower in zip(self.tasks, config.task_towers):
            check_module_name(task)
            names = list(tower.intervention_tower_names)
            check_earlier_towers(task, names, "intervention_tower_names", widths)
            mlp, widths[task.name] = optional_mlp(tower, "mlp", input_width,
                                                  f"{task.where}.mlp")
            task_input = task_input_of(config, experts, width, mlp or nn.Identity(), KIND)
            sources = _sources(task, tower)
            intervention = _intervention(task, tower, widths, sources)
            tasks[task.name] = DC2VRTask(task_input, sources, intervention,
                                         nn.Linear(widths[task.name], task.num_class))
        self.net = DBMTLNet(bottom or nn.Identity(), experts, tasks)


def _sources(task, tower) -> list[str]:
    """The towers whose outputs the task's intervention reads: none without
    ``low_rank_dim``, as in TorchEasyRec (its intervention_tower_names then have no
    effect: said in a warning); a tower's ``dropout_ratio`` is noted, never applied.

    Raises:
        ModelError: ``low_rank_dim`` without intervention_tower_names.
    """
    names = list(tower.intervention_tower_names)
    if tower.HasField("dropout_ratio"):
        logger.warning("%s.dropout_ratio=%g: noted and not used, as TorchEasyRec's DC2VR "
                       "never applies it", task.where, tower.dropout_ratio)
    if not tower.HasField("low_rank_dim"):
        if names:
            logger.warning("%s.intervention_tower_names %s: not read without low_rank_dim "
                           "(as in TorchEasyRec); the task's logit reads its own tower. "
                           "Set low_rank_dim to intervene with those towers",
                           task.where, names)
        return []
    if not names:
        raise ModelError(f"{task.where}.low_rank_dim={tower.low_rank_dim} is set without "
                         f"intervention_tower_names; name the earlier towers whose outputs "
                         f"intervene on this one, or remove low_rank_dim")
    return names


def _intervention(task, tower, widths: dict[str, int], sources: list[str]) -> nn.Module:
    """The task's ``Intervention`` over its net (``widths[task.name]`` wide) and its
    sources' mean, or ``NoIntervention`` without sources.

    Raises:
        ModelError: sources of different widths, or a ``low_rank_dim`` not below the
            task's width.
    """
    if not sources:
        return NoIntervention()
    source_widths = {name: widths[name] for name in sources}
    if len(set(source_widths.values())) > 1:
        listed = ", ".join(f"{name} {width}" for name, width in source_widths.items())
        raise ModelError(f"{task.where}.intervention_tower_names: towers of different "
                         f"widths ({listed}); their outputs are averaged, so they must be "
                         f"equally wide (set their mlp's last hidden_units alike)")
    base_width, rank = widths[task.name], int(tower.low_rank_dim)
    if not 1 <= rank < base_width:
        raise ModelError(f"{task.where}.low_rank_dim={rank}; allowed: 1 to "
                         f"{base_width - 1}, below the tower's width {base_width} (its "
                         f"mlp's output, else its input)")
    return Intervention(base_width, widths[sources[0]], rank)
