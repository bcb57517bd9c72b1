"""Optimizers from ``train_config``: the fused sparse spec and the torch dense optimizers.

Embedding tables (dense and dynamic) are updated by the sparse optimizer inside
the backward pass of the embedding collection; every other parameter of the
model is updated by the dense optimizer after backward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from hashrec.checkpoint.optimizer_state import GROUP_BASE_LR, GROUP_WHERE
from hashrec.table import SparseAdagrad, SparseAdam, SparseRowWiseAdagrad, SparseSGD
from hashrec.train.errors import TrainError
from hashrec.train.lr_schedules import build_schedule
from hashrec.train.param_groups import ParamGroup, group_settings, param_groups

SPARSE_OPTIMIZERS = ("sgd_optimizer", "adagrad_optimizer", "adam_optimizer",
                     "rowwise_adagrad_optimizer")
DENSE_OPTIMIZERS = ("sgd_optimizer", "adagrad_optimizer", "adam_optimizer", "adamw_optimizer")
SPARSE_WHERE = "train_config.sparse_optimizer"
DENSE_WHERE = "train_config.dense_optimizer"


def _kind(optimizer_config, allowed: tuple[str, ...], where: str) -> str:
    kind = optimizer_config.WhichOneof("optimizer")
    if kind not in allowed:
        raise TrainError(f"{where}: {kind or 'no optimizer'} is not supported; allowed: "
                         f"{', '.join(allowed)}")
    return kind


def sparse_optimizer_spec(sparse_config):
    """The hashrec.table optimizer spec of ``train_config.sparse_optimizer``.

    Raises:
        TrainError: an unsupported optimizer or option (the fused optimizers'
            ``gradient_clipping`` and row-wise Adagrad ``weight_decay`` are not
            implemented; ``train_config.grad_clipping`` clips dense gradients).
    """
    kind = _kind(sparse_config, SPARSE_OPTIMIZERS, SPARSE_WHERE)
    c = getattr(sparse_config, kind)
    where = f"{SPARSE_WHERE}.{kind}"
    if c.gradient_clipping:
        raise TrainError(f"{where}.gradient_clipping is not supported for fused sparse "
                         f"updates; remove it (train_config.grad_clipping clips dense grads)")
    try:
        if kind == "sgd_optimizer":
            return SparseSGD(lr=c.lr)
        if kind == "adagrad_optimizer":
            return SparseAdagrad(lr=c.lr, initial_accumulator_value=c.initial_accumulator_value,
                                 eps=c.eps)
        if kind == "adam_optimizer":
            return SparseAdam(lr=c.lr, beta1=c.beta1, beta2=c.beta2, eps=c.eps,
                              weight_decay=c.weight_decay)
        if c.weight_decay:
            raise ValueError(f"weight_decay={c.weight_decay} is not supported; allowed: 0")
        return SparseRowWiseAdagrad(lr=c.lr, initial_accumulator_value=c.initial_accumulator_value,
                                    eps=c.eps)
    except ValueError as err:
        raise TrainError(f"{where}: {err}") from err


def sparse_schedule(sparse_config):
    """Learning-rate schedule of the sparse optimizer."""
    kind = _kind(sparse_config, SPARSE_OPTIMIZERS, SPARSE_WHERE)
    return build_schedule(sparse_config, getattr(sparse_config, kind).lr, SPARSE_WHERE)


def dense_parameters(model: nn.Module) -> dict[str, nn.Parameter]:
    """Trainable parameters outside the embedding collection (``model.embedding``), by
    name."""
    return {name: p for name, p in model.named_parameters()
            if p.requires_grad and not name.startswith("embedding.")}


_TORCH_OPTIMIZERS = {"sgd_optimizer": torch.optim.SGD, "adagrad_optimizer": torch.optim.Adagrad,
                     "adam_optimizer": torch.optim.Adam, "adamw_optimizer": torch.optim.AdamW}


@dataclass
class DenseOptimizer:
    """The torch optimizers over the dense parameters, one per kind (the dense optimizer's
    own kind first, then each other kind that ``param_optimizers`` entries name, in config
    order), and the schedule of each of their param groups (``schedules[i]`` sets
    ``param_groups[i]``); ``schedule`` is the dense optimizer's own, whose rate the progress
    line shows; ``entries`` names the entries' groups in config order."""

    optimizers: tuple[torch.optim.Optimizer, ...]
    schedule: object
    schedules: tuple
    entries: tuple[str, ...] = ()

    @property
    def param_groups(self) -> list[dict]:
        """Every optimizer's param groups, in the order of ``optimizers``."""
        return [group for optimizer in self.optimizers for group in optimizer.param_groups]

    def parameters(self) -> list[nn.Parameter]:
        """Every dense parameter the optimizers update, in the order of ``param_groups``."""
        return [p for group in self.param_groups for p in group["params"]]

    def zero_grad(self) -> None:
        for optimizer in self.optimizers:
            optimizer.zero_grad(set_to_none=True)

    def set_learning_rates(self, step: int, epoch: int) -> float:
        """Set every param group's rate for ``step``; returns ``schedule``'s."""
        for group, schedule in zip(self.param_groups, self.schedules):
            group["lr"] = schedule(step, epoch)
        return self.schedule(step, epoch)

    def entry_rates(self) -> dict[str, float]:
        """The rate each ``param_optimizers`` / ``part_optimizers`` entry's group has now,
        by the entry's name (``param_optimizers[0]``), in config order, for the progress
        line."""
        rates = {group[GROUP_WHERE]: group["lr"] for group in self.param_groups
                 if GROUP_WHERE in group}
        return {where.removeprefix(DENSE_WHERE + "."): rates[where] for where in self.entries}


def build_dense_optimizer(dense_config, parameters: dict[str, nn.Parameter]) -> DenseOptimizer:
    """Torch optimizers of ``train_config.dense_optimizer`` over ``parameters`` (name ->
    parameter): one per kind, a param group per ``param_optimizers`` entry in the one of
    its kind (hashrec.train.param_groups).

    Raises:
        TrainError: an unsupported optimizer, invalid hyper-parameters or param optimizers.
    """
    kind = _kind(dense_config, DENSE_OPTIMIZERS, DENSE_WHERE)
    c = getattr(dense_config, kind)
    if not parameters:
        raise TrainError("the model has no dense parameters for train_config.dense_optimizer")
    groups = param_groups(dense_config, kind, parameters, DENSE_WHERE)
    by_kind: dict[str, list[ParamGroup]] = {kind: []}
    for group in groups:
        by_kind.setdefault(group.kind, []).append(group)
    # On GPUs Adam's fused kernel updates every parameter in a few launches.
    fused = all(p.is_cuda for p in parameters.values())
    optimizers, schedules = [], []
    for each, members in by_kind.items():
        if members:  # the dense optimizer's kind trains nothing where entries take all
            defaults = group_settings(kind, c) if each == kind else members[0].settings
            optimizers.append(_torch_optimizer(each, members, defaults, fused))
            schedules += [g.schedule for g in members]
    schedule = build_schedule(dense_config, c.lr, DENSE_WHERE)
    return DenseOptimizer(tuple(optimizers), schedule, tuple(schedules),
                          tuple(g.where for g in groups if g.where != DENSE_WHERE))


def _torch_optimizer(kind: str, groups: list[ParamGroup], defaults: dict,
                     fused: bool) -> torch.optim.Optimizer:
    """The torch optimizer of ``kind`` over ``groups``, an entry's group carrying its config
    path and configured lr for the checkpoints."""
    torch_groups = [{"params": list(g.parameters), **g.settings}
                    | ({GROUP_WHERE: g.where, GROUP_BASE_LR: g.settings["lr"]}
                       if g.where != DENSE_WHERE else {})
                    for g in groups]
    options = {"fused": True} if fused and kind in ("adam_optimizer", "adamw_optimizer") else {}
    try:
        return _TORCH_OPTIMIZERS[kind](torch_groups, **defaults, **options)
    except ValueError as err:
        where = ", ".join(f"{g.where}.{kind}" for g in groups)
        raise TrainError(f"{where}: {err}") from err


def clip_gradients(parameters, grad_clipping) -> None:
    """Apply ``train_config.grad_clipping`` (norm | value | none) to dense gradients."""
    if grad_clipping is None:
        return
    kind = grad_clipping.clipping_type.lower()
    if kind in ("", "none"):
        return
    if kind == "norm":
        torch.nn.utils.clip_grad_norm_(parameters, grad_clipping.max_gradient,
                                       norm_type=grad_clipping.norm_type)
    elif kind == "value":
        torch.nn.utils.clip_grad_value_(parameters, grad_clipping.max_gradient)
    else:
        raise TrainError(f"train_config.grad_clipping.clipping_type={kind!r}; allowed: norm, "
                         f"value, none")
