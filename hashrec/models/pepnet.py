"""PEPNet: parameter and embedding personalized network, a multi-task ranking model
(Chang et al. 2023, https://arxiv.org/abs/2302.01115; the blocks are
``hashrec.modules.personalized``).

It reads up to three DEEP feature groups, each concatenated in ``feature_names`` order:

* the main group (``main_group_name``, default ``all``), E (B, D): every task's input;
* the domain group (``domain_group_name``, or the group ``domain`` where there is one):
  with it EPNet scales E by a gate over [domain, E] (hidden width ``epnet_hidden_unit``,
  default D; bound ``epnet_gamma``);
* the user/item/author prior group (``uia_group_name``, or the group ``uia``): with it
  each task gets a PPNet tower of ``ppnet_hidden_units`` layers (``ppnet_activation``,
  ``ppnet_dropout_ratio``), each layer scaled by a gate over [uia, the tower's input]
  (bound ``ppnet_gamma``).

Each task's input (E, personalized where the groups say so) then goes through its task
tower, the optional ``mlp`` and a linear layer to its ``num_class`` logits, as in the
other multi-task models (``hashrec.models.tasks``).

Towers per domain (TorchEasyRec's ``domain_input_name``, ``task_domain_num`` K): each
task has K towers, all run on every row; ``domain_input_name`` names the label field
(``data_config.label_fields``) holding each row's domain, an id in [0, K) (checked when
the data is read: another value is an error naming the column and the row). As in
TorchEasyRec:

* the outputs (the forward's and the export's) are every domain's,
  ``logits_<tower_name>_<k>`` and ``probs_<tower_name>_<k>`` (``y_...`` with l2_loss);
* the task's loss and metrics read, on each row, the logits of the row's domain (a
  gather by the domain index): a domain's tower is trained and evaluated on its domain's
  rows alone, and the loss keeps its name and its mean over the whole batch
  (``binary_cross_entropy_ctr``, ``auc_ctr``). The forward of a batch with the domain
  labels gives those rows' outputs too, under the task's names (``probs_ctr``).
"""

from __future__ import annotations

import logging
import math

import torch
from torch import nn

from hashrec.config.floats import proto_float
from hashrec.models.errors import ModelError
from hashrec.models.feature_groups import DEEP
from hashrec.models.group_net import GroupNetModel
from hashrec.models.mmoe import check_module_name, task_tower
from hashrec.models.outputs import split_task_logits, task_outputs
from hashrec.models.tasks import output_tasks, task_domains
from hashrec.modules.activation import canonical_activation
from hashrec.modules.personalized import DomainTowers, EPNet, PPNet, pick_domain

logger = logging.getLogger(__name__)

DOMAIN = "domain"
UIA = "uia"


class PassFirst(nn.Module):
    """``forward(x, other) -> x``: stands for an EPNet or a PPNet the model does not have,
    so that the network calls every part alike (TorchScript compiles every call)."""

    def forward(self, x: torch.Tensor, other: torch.Tensor) -> torch.Tensor:
        return x


class PEPNetTask(nn.Module):
    """One task: ``forward(x (B, D), uia (B, P)) -> logits (B, num_class)``, its PPNet
    (or ``PassFirst``) then its tower; with towers per domain (``DomainTowers``) every
    domain's logits, (B, K * num_class)."""

    def __init__(self, ppnet: nn.Module, tower: nn.Module) -> None:
        super().__init__()
        self.ppnet = ppnet
        self.tower = tower

    def forward(self, x: torch.Tensor, uia: torch.Tensor) -> torch.Tensor:
        return self.tower(self.ppnet(x, uia))


class PEPNetNet(nn.Module):
    """PEPNet's dense network, shared by the eager model and its scripted export:
    ``forward([main, (domain), (uia)]) -> logits (B, sum of the tasks' num_class)``; with
    towers per domain each task's K domains' logits side by side (B, sum of K * num_class).

    Args:
        epnet: the EPNet over (main, domain), or None without a domain group.
        tasks: tower_name -> ``PEPNetTask``, in task order (keyed by name, so that a
            fine-tune start restores each task's parts from the checkpoint's task of
            that name).
        has_uia: the inputs end with the uia group.
    """

    def __init__(self, epnet: nn.Module | None, tasks: dict[str, nn.Module],
                 has_uia: bool) -> None:
        super().__init__()
        self.has_domain = epnet is not None
        self.has_uia = has_uia
        self.epnet = epnet if epnet is not None else PassFirst()
        self.tasks = nn.ModuleDict(tasks)

    def forward(self, inputs: list[torch.Tensor]) -> torch.Tensor:
        x = inputs[0]
        if self.has_domain:
            x = self.epnet(x, inputs[1])
        uia = inputs[-1] if self.has_uia else x
        logits: list[torch.Tensor] = []
        for task in self.tasks.values():
            logits.append(task(x, uia))
        return torch.cat(logits, dim=-1)


class PEPNet(GroupNetModel):
    """See the module docstring; arguments as ``RankModel``.

    Attributes:
        input_groups: the main group, then the domain and the uia group where there are.
        net: the dense network (``PEPNetNet``).
    """

    kind = "pepnet"

    def __init__(self, model_config, feature_set, sparse_optimizer, device=None,
                 embedding: nn.Module | None = None) -> None:
        super().__init__(model_config, feature_set, sparse_optimizer, device, embedding)
        config = model_config.pepnet
        main = self.group(config.main_group_name, DEEP, "pepnet.main_group_name")
        domain = self._optional_group(config, "domain_group_name", DOMAIN)
        uia = self._optional_group(config, "uia_group_name", UIA)
        self.input_groups = [g for g in (main, domain, uia) if g is not None]
        unread = [name for name in self.groups
                  if name not in {g.name for g in self.input_groups}]
        if unread:
            raise ModelError(
                f"pepnet reads the main group ({main.name!r}), the domain group and the "
                f"uia group; feature groups {unread} are none of them and would be left "
                f"out: name them in main_group_name, domain_group_name or uia_group_name, "
                f"or remove them")
        epnet = self._epnet(config, main.dim, domain.dim) if domain is not None else None
        if domain is None and config.HasField("epnet_hidden_unit"):
            logger.warning("pepnet.epnet_hidden_unit is set but there is no domain group "
                           "(domain_group_name, or a group named %r): no EPNet", DOMAIN)
        if uia is None and len(config.ppnet_hidden_units):
            logger.warning("pepnet.ppnet_hidden_units is set but there is no uia group "
                           "(uia_group_name, or a group named %r): no PPNet", UIA)
        # The label field of each row's domain and the domains; "" and 0 without towers
        # per domain.
        self.domain_input, self.domains = task_domains(model_config,
                                                       feature_set.label_fields)
        self.output_tasks = output_tasks(self.tasks, self.domains)
        self._check_domain_names()
        tasks = {}
        for task, tower in zip(self.tasks, config.task_towers):
            check_module_name(task)
            ppnet = self._ppnet(config, main.dim, uia.dim) if uia is not None else PassFirst()
            width = ppnet.out_dim if uia is not None else main.dim
            towers = task_tower(task, tower, width) if not self.domains else \
                DomainTowers([task_tower(task, tower, width) for _ in range(self.domains)])
            tasks[task.name] = PEPNetTask(ppnet, towers)
        self.net = PEPNetNet(epnet, tasks, uia is not None)

    def _check_domain_names(self) -> None:
        """With towers per domain, the domain label is no task's label, and a task's
        per-domain name is not another task's (``ctr`` and ``ctr_0`` would both give
        ``probs_ctr_0``)."""
        labels = [t.name for t in self.tasks
                  if self.domains and t.label_name == self.domain_input]
        if labels:
            raise ModelError(f"pepnet.domain_input_name {self.domain_input!r} is the label of "
                             f"task_towers {labels}; it names each row's domain, not a target: "
                             f"give it a label field of its own")
        names = {task.name for task in self.tasks}
        clash = sorted(t.name for t in self.output_tasks if self.domains and t.name in names)
        if clash:
            raise ModelError(f"pepnet.task_towers: the towers per domain name their outputs "
                             f"<tower_name>_<domain>, and {clash} are tower names too: rename "
                             f"those towers")

    def predictions(self, logits: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each task's outputs; with towers per domain every domain's, suffixed
        ``_<tower_name>_<k>`` (what the export gives)."""
        if not self.domains:
            return super().predictions(logits)
        tasks = self.output_tasks
        return task_outputs(split_task_logits(logits, [t.num_class for t in tasks], True),
                            [t.suffix for t in tasks], [t.regression for t in tasks])

    def batch_predictions(self, logits: torch.Tensor, batch) -> dict[str, torch.Tensor]:
        """``predictions``; with towers per domain and the batch's domain labels, also each
        task's outputs of the row's domain under the task's names (``probs_ctr``), which
        the metrics read."""
        out = self.predictions(logits)
        if self.domains and self.domain_input in batch.labels:
            picked = self.pick_domains(logits, self.domain_ids(batch))
            out.update(super().predictions(picked))
        return out

    def pick_domains(self, logits: torch.Tensor, domains: torch.Tensor) -> torch.Tensor:
        """The dense network's logits of every domain (B, sum of K * num_class) -> each
        row's domain's (B, sum of num_class), the tasks' side by side (``RankModel``'s
        layout); ``domains`` (B,) int64 in [0, K)."""
        parts, start = [], 0
        for task in self.tasks:
            width = self.domains * task.num_class
            parts.append(pick_domain(logits[:, start:start + width], domains, self.domains))
            start += width
        return torch.cat(parts, dim=-1)

    def domain_ids(self, batch) -> torch.Tensor:
        """The batch's (B,) int64 domain index of each row (label ``domain_input_name``).

        Raises:
            ModelError: the batch has no such label.
        """
        if self.domain_input not in batch.labels:
            raise ModelError(f"batch has no domain label {self.domain_input!r} "
                             f"(pepnet.domain_input_name; labels: {list(batch.labels)})")
        return batch.labels[self.domain_input].to(torch.int64)

    @property
    def target_count(self) -> int:
        return super().target_count + int(bool(self.domains))

    def targets(self, batch) -> tuple[torch.Tensor, ...]:
        """``RankModel.targets``, then with towers per domain the rows' domain ids (B,)."""
        targets = super().targets(batch)
        return (*targets, self.domain_ids(batch)) if self.domains else targets

    def losses_from_logits(self, logits: torch.Tensor, labels: torch.Tensor,
                           *rest: torch.Tensor) -> dict[str, torch.Tensor]:
        """``RankModel.losses_from_logits``; with towers per domain, of each row's domain's
        logits (``rest`` ends with the domain ids)."""
        if not self.domains:
            return super().losses_from_logits(logits, labels, *rest)
        return super().losses_from_logits(self.pick_domains(logits, rest[-1]), labels,
                                          *rest[:-1])

    def loss(self, predictions: dict[str, torch.Tensor], batch,
             targets: tuple[torch.Tensor, ...] | None = None) -> dict[str, torch.Tensor]:
        """``RankModel.loss``; with towers per domain, of every domain's logits in
        ``predictions`` (``logits_<tower_name>_<k>``), each row's domain's picked."""
        if not self.domains:
            return super().loss(predictions, batch, targets)
        parts = [predictions[task.logits] for task in self.output_tasks]
        logits = torch.cat([p if p.dim() == 2 else p.unsqueeze(-1) for p in parts], dim=-1)
        return self.losses_from_logits(logits, *(targets or self.targets(batch)))

    def _optional_group(self, config, field: str, default: str):
        """The group ``config.<field>`` names, else the group ``default`` where there is
        one, else None."""
        if config.HasField(field):
            return self.group(getattr(config, field), DEEP, f"pepnet.{field}")
        return self.group(default, DEEP, f"pepnet.{field}") if default in self.groups \
            else None

    @staticmethod
    def _epnet(config, main_dim: int, domain_dim: int) -> EPNet:
        hidden = config.epnet_hidden_unit if config.HasField("epnet_hidden_unit") \
            else main_dim
        if hidden < 1:
            raise ModelError(f"pepnet.epnet_hidden_unit={hidden}; allowed: 1 or more (unset: "
                             f"the main group's width, {main_dim})")
        return EPNet(main_dim, domain_dim, hidden, _gamma(config, "epnet_gamma"))

    @staticmethod
    def _ppnet(config, main_dim: int, uia_dim: int) -> PPNet:
        units = tuple(int(u) for u in config.ppnet_hidden_units)
        if not units or min(units) < 1:
            raise ModelError(f"pepnet.ppnet_hidden_units={list(units)}; the uia group's "
                             f"PPNet needs one width (1 or more) per layer")
        ratios = tuple(proto_float(float(r)) for r in config.ppnet_dropout_ratio)
        if len(ratios) not in (0, 1, len(units)) or any(not 0 <= r < 1 for r in ratios):
            raise ModelError(f"pepnet.ppnet_dropout_ratio={list(ratios)}; allowed: none, one "
                             f"for every layer or one per layer ({len(units)}), each in "
                             f"[0, 1)")
        if len(ratios) == 1:
            ratios = ratios * len(units)
        try:
            canonical_activation(config.ppnet_activation)
        except ValueError as err:
            raise ModelError(f"pepnet.ppnet_activation: {err}") from None
        return PPNet(main_dim, uia_dim, units, config.ppnet_activation, ratios,
                     _gamma(config, "ppnet_gamma"))


def _gamma(config, field: str) -> float:
    value = proto_float(float(getattr(config, field)))
    if not (math.isfinite(value) and value > 0):
        raise ModelError(f"pepnet.{field}={value}; allowed: a finite number > 0 (the gate's "
                         f"upper bound, default 2)")
    return value
