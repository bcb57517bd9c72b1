"""The dense optimizers' state in a checkpoint.

The trainer runs one torch optimizer per kind of dense optimizer: the dense optimizer's
own, and one per other kind that ``param_optimizers`` (or ``part_optimizers``) entries
name. meta.json's ``dense.optimizer`` describes the first of them (its file
``optimizer.pt``, its class and hyperparameters, as in checkpoints of one optimizer) and,
where there are more, lists the others the same way under ``more`` (``optimizer-1.pt``
...). A restore pairs saved and configured optimizers by class: every param group of an
entry records the entry's config path, so an entry whose kind the config changed is
named.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from typing import Any

import torch

from hashrec.checkpoint import layout
from hashrec.checkpoint.dense import load_state, save_state
from hashrec.checkpoint.errors import CheckpointError

logger = logging.getLogger(__name__)

# Optimizer settings that are no hyperparameters: the parameters, what torch's learning-rate
# schedulers add, and implementation flags that follow the device (``fused`` on GPUs).
_NOT_HYPERPARAMETERS = frozenset({"params", "initial_lr", "foreach", "fused", "capturable",
                                  "differentiable"})
# Keys of the param group of a ``param_optimizers`` entry: the entry's config path and its
# configured lr (the group's ``lr`` is the schedule's rate of the last step), so that a restore
# names what the config changed per entry.
GROUP_WHERE = "config_path"
GROUP_BASE_LR = "base_lr"
# meta.json: the optimizers after the first, each described as the first is.
MORE = "more"
# Where the param groups without GROUP_WHERE belong: the dense optimizer's own group (and,
# in checkpoints saved before entries were named, every group, all of one kind).
_DENSE_OWN = "train_config.dense_optimizer"
# The torch optimizers ``_saved_kind`` tells apart (the trainer's dense optimizers).
_TOLD_APART = frozenset({"SGD", "Adagrad", "Adam", "AdamW"})
_FRESH = "restore without optimizer state (--ignore_restore_optimizer) to start"


def optimizer_list(optimizers: Any) -> list[Any]:
    """``optimizers`` (None, one torch optimizer or a sequence of them) as a list."""
    if optimizers is None:
        return []
    if isinstance(optimizers, Sequence):
        return list(optimizers)
    return [optimizers]


def write_optimizer_states(root: str, states: list[tuple[dict, dict]]) -> dict | None:
    """Writes each (state dict, ``describe_optimizer`` description) under ``root``; returns
    meta.json's ``dense.optimizer`` entry (None for no state)."""
    entries = [{**save_state(state, os.path.join(root, layout.optimizer_file(i))), **described}
               for i, (state, described) in enumerate(states)]
    if not entries:
        return None
    return {**entries[0], MORE: entries[1:]} if len(entries) > 1 else entries[0]


def saved_optimizers(entry: dict[str, Any]) -> list[dict[str, Any]]:
    """The description of each saved optimizer of meta.json's ``dense.optimizer`` entry."""
    return [{k: v for k, v in entry.items() if k != MORE}, *entry.get(MORE, ())]


def _without_absorbed(state: dict[str, Any], optimizer: Any, model: torch.nn.Module | None,
                      absorbed: list[str]) -> dict[str, Any]:
    """The saved optimizer state without the entries of the ``absorbed`` parameters (the
    biases of linear layers before batch norm, which the model no longer has): each sat
    right after its layer's weight, in the order of ``model.named_parameters()``. The
    state as saved when the saved groups do not have that layout."""
    if model is None or not absorbed:
        return state
    names = {id(p): name for name, p in model.named_parameters()}
    dropped, groups = set(), []
    for saved, group in zip(state["param_groups"], optimizer.param_groups):
        old = []
        for param in group["params"]:
            name = names.get(id(param), "")
            old.append(name)
            bias = name[:-len("weight")] + "bias" if name.endswith(".weight") else None
            if bias in absorbed:
                old.append(bias)
        if len(old) != len(saved["params"]):
            return state
        kept = [i for i, name in zip(saved["params"], old) if name not in absorbed]
        dropped.update(i for i in saved["params"] if i not in kept)
        groups.append({**saved, "params": kept})
    return {**state, "param_groups": groups,
            "state": {i: v for i, v in state["state"].items() if i not in dropped}}


def describe_optimizer(optimizer: Any) -> dict[str, Any]:
    """{"type": class name, "hyperparameters": its settings} of a torch optimizer for
    meta.json: what a restore checks the configured optimizer against."""
    return {"type": type(optimizer).__name__,
            "hyperparameters": _hyperparameters(optimizer.defaults)}


def _hyperparameters(settings: dict[str, Any]) -> dict[str, Any]:
    """The settings of an optimizer (or one of its param_groups) that say what it computes,
    as JSON holds them (tuples as lists): not its parameters, not the implementation flags
    that follow the device, not values JSON cannot hold."""
    found = {}
    for key, value in settings.items():
        if key in _NOT_HYPERPARAMETERS:
            continue
        value = list(value) if isinstance(value, tuple) else value
        try:
            json.dumps(value)
        except (TypeError, ValueError):
            continue
        found[key] = value
    return found


def _saved_kind(groups: Any) -> str | None:
    """The class of the torch optimizer that saved ``groups`` (its param_groups), told by
    the settings only it has among the dense optimizers the trainer builds: for
    checkpoints that do not record it. None where they do not tell."""
    group = groups[0] if isinstance(groups, list) and groups else None
    if not isinstance(group, dict):
        return None
    if "momentum" in group and "dampening" in group:
        return "SGD"
    if "lr_decay" in group:
        return "Adagrad"
    if "betas" in group and "decoupled_weight_decay" in group:  # torch >= 2.6 saves it
        return "AdamW" if group["decoupled_weight_decay"] else "Adam"
    return None


def _shown(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    if isinstance(value, list):
        return "(" + ", ".join(_shown(v) for v in value) + ")"
    return str(value)


def _note_changed(path: str, before: dict[str, Any], after: dict[str, Any],
                  where: str = "") -> None:
    """One INFO line naming the hyperparameters that the configured optimizer (``where``:
    a param group of it) changes."""
    changed = [f"{key} {_shown(after[key])} (checkpoint {_shown(before[key])})"
               for key in sorted(after) if key in before and before[key] != after[key]]
    if changed:
        logger.info("%s: the dense optimizer's state is restored with the configured "
                    "hyperparameters, not the saved ones%s: %s", path,
                    f" (of {where})" if where else "", ", ".join(changed))


def _note_changed_groups(path: str, saved: list[dict], configured: list[dict]) -> None:
    """One INFO line per ``param_optimizers`` entry whose hyperparameters the config
    changed (its lr: the configured one, not the scheduled rate of the saved step)."""
    for before, after in zip(saved, configured):
        where = after.get(GROUP_WHERE)
        if where is None or before.get(GROUP_WHERE) != where:
            continue
        settings = [{("lr" if k == GROUP_BASE_LR else k): v
                     for k, v in _hyperparameters(group).items() if k not in ("lr", GROUP_WHERE)}
                    for group in (before, after)]
        _note_changed(path, *settings, where=where)


def _steps_beside_parameters(optimizer: Any, group: dict) -> None:
    """Moves the step counts of ``group``'s parameters onto their devices as float32: a
    fused or capturable group keeps them there, and ``load_state_dict`` left them where
    the saved settings had them (on the host, for a checkpoint written without a fused
    optimizer, on the CPU say)."""
    for param in group["params"]:
        step = optimizer.state.get(param, {}).get("step")
        if isinstance(step, torch.Tensor) and (step.device != param.device
                                               or step.dtype != torch.float32):
            optimizer.state[param]["step"] = step.to(param.device, torch.float32)


def _group_kinds(groups: list[dict], kind: str | None) -> dict[str, str | None]:
    """{config path of the group (its entry's, or the dense optimizer's): kind}."""
    return {g.get(GROUP_WHERE, _DENSE_OWN): kind for g in groups}


def _paired(root: str, saved: list[tuple[dict, dict]], optimizers: list[Any]
            ) -> list[tuple[dict, dict, Any]]:
    """(description, state, configured optimizer) of each saved optimizer, by class.

    Raises:
        CheckpointError: a group (the dense optimizer's or an entry's) of another kind in
            the checkpoint than in the config, or other kinds of optimizers altogether.
    """
    wanted = [type(o).__name__ for o in optimizers]
    told = all(w in _TOLD_APART for w in wanted)
    kinds = [entry.get("type") or (_saved_kind(state.get("param_groups")) if told else None)
             for entry, state in saved]
    if len(saved) == 1 and len(optimizers) == 1 and kinds[0] is None:
        return [(*saved[0], optimizers[0])]  # an older checkpoint of unknown kind
    before, after = {}, {}
    for (_, state), kind in zip(saved, kinds):
        before.update(_group_kinds(state.get("param_groups") or [], kind))
    for optimizer, kind in zip(optimizers, wanted):
        after.update(_group_kinds(optimizer.param_groups, kind))
    changed = [w for w in after if w in before and before[w] not in (None, after[w])]
    if _DENSE_OWN in changed or (not changed and len(saved) == len(optimizers) == 1
                                 and kinds[0] != wanted[0]):
        was, now = before.get(_DENSE_OWN, kinds[0]), after.get(_DENSE_OWN, wanted[0])
        raise CheckpointError(
            f"{os.path.join(root, saved[kinds.index(was)][0]['file'])}: dense optimizer {was} "
            f"in the checkpoint, {now} in the model (train_config.dense_optimizer); {_FRESH} "
            f"{now} fresh, or configure {was} to continue its state")
    if changed:
        named = ", ".join(f"{w} ({after[w]} in the config, {before[w]} in the checkpoint)"
                          for w in changed)
        raise CheckpointError(
            f"{root}: the dense optimizer's param_optimizers entries changed kind: {named}; "
            f"{_FRESH} them fresh, or configure the checkpoint's kinds to continue their state")
    if sorted(map(str, kinds)) != sorted(wanted):
        raise CheckpointError(
            f"{root}: the checkpoint holds the dense optimizers {', '.join(map(str, kinds))}, "
            f"the config builds {', '.join(wanted)} (train_config.dense_optimizer and its "
            f"param_optimizers); {_FRESH} them fresh, or configure the entries it was saved "
            f"with (the model_dir's pipeline.config)")
    return [(*saved[kinds.index(kind)], optimizer) for optimizer, kind in zip(optimizers, wanted)]


def restore_optimizer_state(root: str, entry: dict[str, Any], optimizers: Any,
                            model: torch.nn.Module | None = None,
                            absorbed: list[str] | None = None) -> None:
    """Loads the dense optimizers' state files into ``optimizers`` (one torch optimizer or
    the trainer's sequence, one per kind).

    Each optimizer must be of the kind saved for its param groups (its class, in meta.json
    since it is recorded; in older checkpoints told from the saved settings' names): a
    ``param_optimizers`` entry of another kind now is named. The state per parameter
    (moments, step counts, momentum buffers) is the checkpoint's; the hyperparameters (lr,
    weight_decay, betas, eps, momentum ...) stay those the optimizers were built with,
    with one INFO line naming those of the dense optimizer that differ from the saved ones,
    and one per ``param_optimizers`` entry whose own differ (older checkpoints record the
    learning rate of their last step only, which the schedule sets anew at every step: it
    is not compared there).

    ``absorbed`` (with ``model``): saved model entries that the model took in otherwise
    (``restore_model``); their parameters' state is dropped.

    Raises:
        CheckpointError: another kind of optimizer, or state that does not fit the
            parameters; the message names the file and says how to start it fresh.
    """
    saved = [(e, load_state(root, e)) for e in saved_optimizers(entry)]
    for described, state, optimizer in _paired(root, saved, optimizer_list(optimizers)):
        state = _without_absorbed(state, optimizer, model, absorbed or [])
        _restore_one(os.path.join(root, described["file"]), described, state, optimizer)


def _restore_one(path: str, entry: dict[str, Any], state: dict, optimizer: Any) -> None:
    """Loads one optimizer's saved ``state``, keeping its configured hyperparameters."""
    configured = [{k: v for k, v in g.items() if k != "params"} for g in optimizer.param_groups]
    try:
        optimizer.load_state_dict(state)
    except (ValueError, KeyError, RuntimeError) as e:
        raise CheckpointError(
            f"{path}: does not match the dense optimizer ({e}); {_FRESH} it fresh") from None
    for group, settings in zip(optimizer.param_groups, configured):
        group.update(settings)
        if group.get("fused") or group.get("capturable"):
            _steps_beside_parameters(optimizer, group)
    _note_changed_groups(path, state["param_groups"], configured)
    if all(GROUP_WHERE in g for g in configured):
        return  # entries only: their lines name what changed
    if "hyperparameters" in entry:
        _note_changed(path, entry["hyperparameters"], _hyperparameters(optimizer.defaults))
    elif configured:  # the settings as saved (load_state_dict fills in what they lack)
        before, after = _hyperparameters(state["param_groups"][0]), _hyperparameters(
            configured[0])
        before.pop("lr", None)
        _note_changed(path, before, after)
