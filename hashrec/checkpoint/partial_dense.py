"""Fine-tune restore of the dense state: the parts of the model that the checkpoint has.

A part is restored whole or not at all: a module's own parameters and buffers (one
layer), or one dense or ZCH table (its rows and step, and a ZCH table's remapper). It
is restored when the checkpoint holds each of its entries, under the name the part
reads (its own, or the one ``fine_tune_ckpt_param_map`` gives), in the same shape; a
dense table's rows when num_buckets and embedding_dim agree, with their optimizer
columns reset. Every other part keeps its fresh initialization: one the checkpoint
lacks, and one it holds in another shape or as another kind of table (the summary
names the shapes or kinds).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import torch

from hashrec.checkpoint.dense import (
    TABLE_DICTS,
    ZCH_REMAPPERS,
    embedding_rows,
    rows_difference,
)
from hashrec.checkpoint.fine_tune_report import Outcome
from hashrec.checkpoint.param_map import NUM_BUCKETS, ZCH, ResolvedMap
from hashrec.embedding.dense_table import DenseTable


def _table_position(key: str) -> int | None:
    """Index of the table name among the dot-separated parts of a table's key, or None
    for a key of no dense or ZCH table."""
    parts = key.split(".")
    for i, part in enumerate(parts[:-2]):
        if part in TABLE_DICTS:
            return i + 1
    return None


def _table_name(key: str) -> str | None:
    position = _table_position(key)
    return None if position is None else key.split(".")[position]


def split_parts(keys: Iterable[str]) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """({module path: its keys}, {dense or ZCH table: its keys}) of ``state_dict`` keys."""
    modules: dict[str, list[str]] = {}
    tables: dict[str, list[str]] = {}
    for key in keys:
        table = _table_name(key)
        if table is None:
            modules.setdefault(key.rpartition(".")[0] or key, []).append(key)
        else:
            tables.setdefault(table, []).append(key)
    return modules, tables


def table_kinds(keys: Iterable[str]) -> dict[str, str]:
    """{table: NUM_BUCKETS or ZCH} of the dense and ZCH tables among ``state_dict`` keys."""
    kinds: dict[str, str] = {}
    for key in keys:
        position = _table_position(key)
        if position is not None:
            parts = key.split(".")
            if parts[position - 1] == ZCH_REMAPPERS:
                kinds[parts[position]] = ZCH
            else:
                kinds.setdefault(parts[position], NUM_BUCKETS)
    return kinds


def source_key(key: str, resolved: ResolvedMap) -> str:
    """The checkpoint key that model key ``key`` reads: by a prefix of the map, else with
    its table renamed by the map, else itself."""
    source = resolved.source_key(key)
    position = _table_position(key)
    if source != key or position is None:
        return source
    parts = key.split(".")
    parts[position] = resolved.source_table(parts[position])
    return ".".join(parts)


@dataclass
class DensePlan:
    """What a fine-tune start loads into the model.

    Attributes:
        state: {model key: value to load} of the parts restored.
        modules, tables: the outcomes of the module parts and of the dense and ZCH tables.
        model_modules, saved_modules: the module parts of the model, of the checkpoint.
    """

    state: dict[str, torch.Tensor] = field(default_factory=dict)
    modules: Outcome = field(default_factory=Outcome)
    tables: Outcome = field(default_factory=Outcome)
    model_modules: list[str] = field(default_factory=list)
    saved_modules: list[str] = field(default_factory=list)


def _part_state(keys: list[str], sources: dict[str, str], own: dict[str, Any],
                saved: dict[str, Any], described: dict[str, Any],
                rows_tables: dict[str, DenseTable]) -> tuple[dict[str, Any], str | None]:
    """(values to load, None), or ({}, why the checkpoint's part does not fit)."""
    values = {}
    for key in keys:
        leaf, source = key.rsplit(".", 1)[-1], sources[key]
        if source not in saved:
            return {}, f"the checkpoint lacks its {leaf}"
        value = saved[source]
        table = rows_tables.get(key)
        if table is not None:
            why = rows_difference(table, value, described.get(source))
            if why is not None:
                return {}, why
            value = embedding_rows(table, value)
        elif torch.is_tensor(value) and tuple(value.shape) != tuple(own[key].shape):
            return {}, (f"{leaf} {tuple(own[key].shape)} here, {tuple(value.shape)} in the "
                        f"checkpoint")
        values[key] = value
    return values, None


def _note_restored(outcome: Outcome, part: str, keys: list[str], sources: dict[str, str],
                   resolved: ResolvedMap, is_table: bool) -> None:
    if all(sources[key] == key for key in keys):
        outcome.restored.append(part)
    elif is_table:
        outcome.renamed[part] = _table_name(sources[keys[0]]) or sources[keys[0]]
    else:
        for key in keys:
            pair = resolved.prefix_of(key)
            if pair is not None:
                outcome.renamed[pair[0]] = pair[1]
            # a key under no map line (its part's other keys are mapped) reads its own name


def _entries_it_dropped(key: str, source: str, own: dict[str, Any], saved: dict[str, Any]
                        ) -> dict[str, Any]:
    """The checkpoint's entries of the module that restores model key ``key`` (from
    ``source``) which the model's module no longer holds, under the model's names: a bias
    an MLP's linear layer before batch norm had, which the module's load hook folds into
    the norm's running mean (``load_state_dict(strict=False)`` skips those no hook takes)."""
    own_module, _, _ = key.rpartition(".")
    saved_module, _, _ = source.rpartition(".")
    if not own_module or not saved_module:
        return {}
    found = {}
    for name, value in saved.items():
        module, _, leaf = name.rpartition(".")
        if module == saved_module and f"{own_module}.{leaf}" not in own:
            found[f"{own_module}.{leaf}"] = value
    return found


def plan_dense(own: dict[str, Any], saved: dict[str, Any], described: dict[str, Any],
               resolved: ResolvedMap, rows_tables: dict[str, DenseTable],
               kinds_differ: dict[str, str]) -> DensePlan:
    """Which parts of the model's state ``own`` the checkpoint state ``saved`` restores.

    Args:
        own: the model's ``state_dict``.
        saved: the checkpoint's dense model state.
        described: the checkpoint's record of its dense tables, by rows key.
        resolved: the param map checked against model and checkpoint.
        rows_tables: {rows key: DenseTable} of the model.
        kinds_differ: {table: why} of the model's tables that the checkpoint holds as
            another kind; they start fresh.
    """
    module_parts, table_parts = split_parts(own)
    plan = DensePlan(model_modules=sorted(module_parts))
    read: set[str] = set()
    for parts, outcome, is_table in ((module_parts, plan.modules, False),
                                     (table_parts, plan.tables, True)):
        for part, keys in sorted(parts.items()):
            sources = {key: source_key(key, resolved) for key in keys}
            read.update(source for source in sources.values() if source in saved)
            if is_table and part in kinds_differ:
                outcome.differs[part] = kinds_differ[part]
                continue
            if not any(source in saved for source in sources.values()):
                outcome.missing.append(part)
                continue
            values, why = _part_state(keys, sources, own, saved, described, rows_tables)
            if why is not None:
                outcome.differs[part] = why
                continue
            plan.state.update(values)
            if not is_table:
                plan.state.update(_entries_it_dropped(keys[0], sources[keys[0]], own, saved))
            _note_restored(outcome, part, keys, sources, resolved, is_table)
    saved_modules, saved_tables = split_parts(saved)
    plan.saved_modules = sorted(saved_modules)
    for parts, outcome in ((saved_modules, plan.modules), (saved_tables, plan.tables)):
        outcome.unused = sorted(part for part, keys in parts.items()
                                if not any(key in read for key in keys))
    return plan
