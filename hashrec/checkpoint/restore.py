"""Restoring a complete checkpoint: dense state and resharded dynamic tables.

Works for any saving and loading world sizes: every rank reads all shards of a
table in chunks and keeps the keys it owns. ``restore_optimizer=False`` is the
fine-tuning mode: the dense optimizer is left alone and the dynamic tables'
optimizer-state columns start from the optimizer's initial state.
"""

from __future__ import annotations

import os
from typing import Any

import torch

from hashrec.checkpoint import layout
from hashrec.checkpoint.dense import restore_model, restore_optimizer_state
from hashrec.checkpoint.dist_util import barrier, rank_and_world, run_on_all_ranks
from hashrec.checkpoint.errors import CheckpointError
from hashrec.checkpoint.shard_file import ShardReader
from hashrec.checkpoint.table_io import ADMISSION, ROWS, load_table

_SECTIONS = (ROWS, ADMISSION, "evicted")


def open_table_shards(path: str, meta: dict[str, Any], name: str) -> list[ShardReader]:
    """Opens and checks every shard of table ``name`` listed in ``meta``.

    Raises:
        CheckpointError: unknown table, or a shard missing, truncated or disagreeing
            with ``meta.json``.
    """
    tables = meta["tables"]
    if name not in tables:
        raise CheckpointError(
            f"{os.path.join(path, layout.META_NAME)}: no dynamic table {name!r}; the "
            f"checkpoint has {sorted(tables)}")
    readers = []
    for shard in tables[name]["shards"]:
        reader = ShardReader(os.path.join(path, shard["stem"]))
        for section in _SECTIONS:
            if section in shard and reader.count(section) != shard[section]:
                raise CheckpointError(
                    f"{reader.stem}.json: {reader.count(section)} entries in {section!r}, "
                    f"meta.json says {shard[section]}")
        readers.append(reader)
    return readers


def read_complete_meta(path: str) -> dict[str, Any]:
    """meta.json of a checkpoint that has its completion marker."""
    if not os.path.isdir(path):
        raise CheckpointError(f"{path}: checkpoint directory does not exist")
    if not layout.is_complete(path):
        raise CheckpointError(
            f"{os.path.join(path, layout.MARKER_NAME)}: missing; {path} is an incomplete "
            f"(interrupted) save; use latest_checkpoint() to find a complete one")
    return layout.read_meta(path)


def _restore_dense(path: str, meta: dict[str, Any], model: torch.nn.Module | None,
                   dense_optimizer: Any, restore_optimizer: bool, strict: bool) -> None:
    dense = meta["dense"]
    if model is not None:
        if dense["model"] is None:
            raise CheckpointError(f"{path}: holds no dense model state")
        restore_model(path, dense["model"], model, strict)
    if dense_optimizer is not None and restore_optimizer:
        if dense["optimizer"] is None:
            raise CheckpointError(
                f"{path}: holds no dense optimizer state; restore without optimizer state")
        restore_optimizer_state(path, dense["optimizer"], dense_optimizer)


def _set_table_step(table: Any, saved_step: int | None) -> None:
    """Puts a table's STEP clock back where it was, if the table exposes a setter."""
    if saved_step is None or not hasattr(table, "step"):
        return
    try:
        table.step = saved_step
    except AttributeError:
        while int(table.step) < saved_step and hasattr(table, "advance_step"):
            table.advance_step()


def restore_checkpoint(path: str, model: torch.nn.Module | None, dense_optimizer: Any,
                       dynamic_tables: dict[str, Any], restore_optimizer: bool = True,
                       strict: bool = True) -> dict[str, Any]:
    """Restores a complete checkpoint saved on any number of ranks.

    Call it on every rank (a collective under torch.distributed). Each rank loads
    the dense state and the dynamic-table entries it owns under the current
    world size. Tables should start empty (loading assigns rows; it never clears).

    Args:
        path: a ``model.ckpt-<step>`` directory with its completion marker.
        model: module to load the dense state into (None: skip dense state).
        dense_optimizer: torch optimizer to load, or None.
        dynamic_tables: {table name: HashTable} of this rank; each must be in the checkpoint.
        restore_optimizer: False (fine-tuning) leaves the dense optimizer fresh and resets
            the tables' optimizer-state columns to the optimizer's initial state.
        strict: passed to ``model.load_state_dict``.

    Returns:
        The checkpoint meta (``step``, ``world_size``, ``extra``, ``tables`` ...) plus
        ``loaded``: {table: {"rows": n, "admission": m}} loaded on this rank.

    Raises:
        CheckpointError: incomplete, missing, truncated or corrupt files, or dims /
            optimizer that do not match; the message names the file and table.
    """
    meta = read_complete_meta(path)
    rank, world_size = rank_and_world()

    def load() -> dict[str, Any]:
        readers = {name: open_table_shards(path, meta, name) for name in sorted(dynamic_tables)}
        _restore_dense(path, meta, model, dense_optimizer, restore_optimizer, strict)
        loaded = {}
        for name, table in sorted(dynamic_tables.items()):
            loaded[name] = load_table(readers[name], name, table, rank, world_size,
                                      restore_optimizer)
            _set_table_step(table, meta["tables"][name].get("table_step"))
        return loaded

    loaded = run_on_all_ranks(load, f"restoring {path}", CheckpointError)
    barrier()
    return {**meta, "loaded": loaded}
