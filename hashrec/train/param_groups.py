"""The dense optimizer's param groups: ``param_optimizers`` (and the older ``part_optimizers``).

Each entry names parameters by a regular expression over their names in
``model.named_parameters()`` (matched in full, as TorchEasyRec matches; the first entry
that matches takes a parameter) and gives them their own optimizer kind, settings and
schedule. Each entry becomes a param group of the torch optimizer of its kind (the trainer
builds one per kind, hashrec.train.optimizers); the parameters no entry takes form the
dense optimizer's own group.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from torch import nn

from hashrec.train.errors import TrainError
from hashrec.train.lr_schedules import build_schedule


@dataclass(frozen=True)
class ParamGroup:
    """One param group: where the config sets it, its optimizer kind (``adam_optimizer``),
    settings, schedule and parameters."""

    where: str
    kind: str
    settings: dict
    schedule: object
    parameters: tuple[nn.Parameter, ...]


def group_settings(kind: str, c) -> dict:
    """The torch param-group settings of dense optimizer config ``c`` of ``kind``."""
    if kind == "sgd_optimizer":
        return {"lr": c.lr, "momentum": c.momentum, "weight_decay": c.weight_decay}
    if kind == "adagrad_optimizer":
        return {"lr": c.lr, "weight_decay": c.weight_decay}
    return {"lr": c.lr, "betas": (c.beta1, c.beta2), "weight_decay": c.weight_decay}


def _entries(dense_config, where: str):
    """(where, entry, message holding its learning_rate oneof or None) of every entry."""
    for i, entry in enumerate(dense_config.param_optimizers):
        lr = entry.param_learning_rate if entry.HasField("param_learning_rate") else None
        yield f"{where}.param_optimizers[{i}]", entry, lr
    for i, entry in enumerate(dense_config.part_optimizers):
        lr = entry if entry.WhichOneof("learning_rate") else None
        yield f"{where}.part_optimizers[{i}]", entry, lr


def _pattern(entry, where: str) -> re.Pattern:
    try:
        return re.compile(entry.regex_pattern)
    except re.error as err:
        raise TrainError(f"{where}.regex_pattern {entry.regex_pattern!r} is not a regular "
                         f"expression: {err}") from None


def param_groups(dense_config, kind: str, named: dict[str, nn.Parameter],
                 where: str) -> list[ParamGroup]:
    """The dense optimizer's param groups over ``named`` (name -> parameter): one per
    ``param_optimizers`` / ``part_optimizers`` entry, in config order, each of its entry's
    kind, then the dense optimizer's own, of ``kind`` (left out when the entries take
    every parameter).

    Raises:
        TrainError: an entry without an optimizer, a bad or unmatched ``regex_pattern``;
            the message names the entry.
    """
    entries = list(_entries(dense_config, where))
    patterns = []
    for at, entry, _ in entries:
        if entry.WhichOneof("optimizer") is None:
            raise TrainError(
                f"{at}: no optimizer; set one of sgd_optimizer, adagrad_optimizer, "
                f"adam_optimizer, adamw_optimizer {{ lr: ... }} here (the dense optimizer's "
                f"{kind}, or another kind)")
        patterns.append(_pattern(entry, at))
    taken: list[list[nn.Parameter]] = [[] for _ in entries]
    rest: list[nn.Parameter] = []
    for name, parameter in named.items():
        hit = next((i for i, p in enumerate(patterns) if p.fullmatch(name)), None)
        (rest if hit is None else taken[hit]).append(parameter)
    names = list(named)
    groups = []
    for (at, entry, lr_holder), parameters in zip(entries, taken):
        if not parameters:
            shown = ", ".join(names[:6]) + (", ..." if len(names) > 6 else "")
            raise TrainError(f"{at}.regex_pattern {entry.regex_pattern!r} matches no dense "
                             f"parameter (or only ones an earlier entry took); it must match "
                             f"a whole name, e.g. one of: {shown}")
        own = entry.WhichOneof("optimizer")
        c = getattr(entry, own)
        schedule = build_schedule(lr_holder if lr_holder is not None else dense_config,
                                  c.lr, at)
        groups.append(ParamGroup(at, own, group_settings(own, c), schedule, tuple(parameters)))
    if rest:
        c = getattr(dense_config, kind)
        groups.append(ParamGroup(where, kind, group_settings(kind, c),
                                 build_schedule(dense_config, c.lr, where), tuple(rest)))
    return groups
