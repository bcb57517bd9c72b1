"""Restoring a complete checkpoint: dense state and resharded dynamic tables.

Works for any saving and loading world sizes: every rank reads all shards of a
table in chunks and keeps the keys it owns. The model must be the one saved (every
dynamic table present, the dense state strict): resuming, evaluating, exporting.
``restore_optimizer=False`` leaves the dense optimizer alone and starts the
optimizer-state columns of dynamic and dense (``num_buckets``) tables from the
optimizer's initial state. Fused tables are matched by name
(``hashrec.checkpoint.tags``). A fine-tune start, which restores what fits a changed
model, is ``hashrec.checkpoint.fine_tune``.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

from hashrec.checkpoint import layout
from hashrec.checkpoint.dense import load_state, restore_model
from hashrec.checkpoint.dist_util import barrier, rank_and_world, run_on_all_ranks
from hashrec.checkpoint.errors import CheckpointDamagedError, CheckpointError
from hashrec.checkpoint.fine_tune_report import Outcome
from hashrec.checkpoint.optimizer_state import restore_optimizer_state
from hashrec.checkpoint.param_map import ResolvedMap
from hashrec.checkpoint.partial_tables import (
    TableSource,
    load_sources,
    model_logical_tables,
    plan_by_name,
    saved_logical_tables,
)
from hashrec.checkpoint.shard_file import ShardReader
from hashrec.checkpoint.table_io import ADMISSION, ROWS, load_table, set_table_step
from hashrec.checkpoint.tags import TAG_TABLES, model_tag_tables, tag_remap

_SECTIONS = (ROWS, ADMISSION, "evicted")

logger = logging.getLogger(__name__)


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


def read_complete_meta(path: str, kind: str = "checkpoint") -> dict[str, Any]:
    """meta.json of a checkpoint (or dump) that has its completion marker; ``kind`` is
    what a missing ``path`` is called in the error ("checkpoint", "dump", ...).

    Raises:
        CheckpointError: ``path`` is missing, a model_dir or dump directory rather than
            one checkpoint, or an interrupted save; the message names what to pass.
    """
    if not os.path.isdir(path):
        raise CheckpointError(f"{path}: {kind} directory does not exist")
    if not layout.is_complete(path):
        raise CheckpointError(_not_complete_message(path))
    return layout.read_meta(path)


def _is_distributed_checkpoint(path: str) -> bool:
    """Whether ``path`` holds torch.distributed.checkpoint shards (``model/*.distcp``), as
    TorchEasyRec saves its checkpoints."""
    model = os.path.join(path, "model")
    return os.path.isdir(model) and any(
        name.endswith(".distcp") or name == ".metadata" for name in os.listdir(model))


def torcheasyrec_message(path: str) -> str | None:
    """The error for ``path`` where it is a TorchEasyRec checkpoint (one HashRec does not
    read), or a model_dir whose checkpoints are such; None otherwise."""
    if not os.path.isdir(path):
        return None
    inside = [os.path.join(path, n) for n in sorted(os.listdir(path))
              if layout.is_checkpoint_name(n)]
    found = next((c for c in [path, *inside] if _is_distributed_checkpoint(c)
                  and not os.path.exists(os.path.join(c, layout.META_NAME))), None)
    if found is None:
        return None
    where = path if found == path else f"{path} (its {os.path.basename(found)})"
    return (f"{where}: holds torch.distributed.checkpoint shards (model/*.distcp), as "
            f"TorchEasyRec writes its checkpoints; HashRec reads only checkpoints it wrote "
            f"(meta.json, model.pt, dynamicemb/, DONE): train the model with HashRec, or "
            f"start it fresh")


def _not_complete_message(path: str) -> str:
    foreign = torcheasyrec_message(path)
    if foreign is not None:
        return foreign
    inside = layout.complete_children(path)
    if inside:
        return (f"{path}: is a model_dir (or dump directory), not a checkpoint; pass one of "
                f"its checkpoints, e.g. the latest complete one: {inside[-1][1]}")
    if any(layout.is_checkpoint_name(n) for n in os.listdir(path)):
        return (f"{path}: is a model_dir (or dump directory) without a complete checkpoint "
                f"(only interrupted saves); nothing to restore")
    parent = os.path.dirname(os.path.abspath(path))
    siblings = layout.complete_children(parent)
    hint = (f"the latest complete one next to it is {siblings[-1][1]}" if siblings
            else "there is no complete checkpoint next to it")
    return (f"{os.path.join(path, layout.MARKER_NAME)}: missing; {path} is not a complete "
            f"checkpoint (an interrupted save, or not a checkpoint at all); {hint}")


def check_tables_present(path: str, meta: dict[str, Any], dynamic_tables: dict[str, Any],
                         tag_tables: dict[str, list[str]]) -> None:
    """Raises CheckpointError, in the terms of the feature configs, when a dynamic storage
    of the model is not in the checkpoint (its tables' dims or options changed)."""
    saved = meta["tables"]
    missing = [name for name in sorted(dynamic_tables) if name not in saved]
    if not missing:
        return
    where = {table: (storage, int(saved[storage]["dim"]))
             for table, (storage, _) in saved_logical_tables(saved).items()}
    lines = []
    for name in missing:
        for table in tag_tables.get(name) or [name]:
            dim = int(dynamic_tables[name].dim)
            if table in where and where[table][1] != dim:
                lines.append(f"table {table!r} has embedding_dim {dim} in the config, "
                             f"{where[table][1]} in the checkpoint")
            elif table in where:
                lines.append(f"table {table!r} is stored with other tables now (storage "
                             f"{name!r}) than in the checkpoint (storage {where[table][0]!r}); "
                             f"its dynamicemb options, data_type or fusion differ")
            else:
                lines.append(f"dynamic table {table!r} (embedding_dim {dim}) is not in the "
                             f"checkpoint")
    found = ", ".join(f"{s} (embedding_dim {d['dim']}, tables "
                      f"{d.get(TAG_TABLES) or 'not recorded'})" for s, d in sorted(saved.items()))
    raise CheckpointError(
        f"{os.path.join(path, layout.META_NAME)}: the model's dynamic tables do not match "
        f"the checkpoint: {'; '.join(lines)}. The checkpoint holds {found or 'no dynamic table'}."
        f" Restore with the feature configs it was saved with (the pipeline.config in its "
        f"model_dir)")


def _restore_dense(path: str, meta: dict[str, Any], model: torch.nn.Module | None,
                   dense_optimizer: Any, restore_optimizer: bool, strict: bool) -> list[str]:
    """Loads the dense state; returns the saved dense and ZCH tables not loaded."""
    dense = meta["dense"]
    unread, absorbed = [], []
    if model is not None:
        if dense["model"] is None:
            raise CheckpointError(f"{path}: holds no dense model state")
        unread, absorbed = restore_model(path, dense["model"], model, strict,
                                         restore_optimizer)
    if dense_optimizer is not None and restore_optimizer:
        if dense["optimizer"] is None:
            raise CheckpointError(
                f"{path}: holds no dense optimizer state; restore without optimizer state")
        restore_optimizer_state(path, dense["optimizer"], dense_optimizer, model, absorbed)
    return unread


def _regrouped(meta_tables: dict[str, Any], dynamic_tables: dict[str, Any],
               tag_tables: dict[str, list[str]]
               ) -> dict[str, tuple[list[TableSource], list[str]]]:
    """{model storage: (its checkpoint sources, its tables the checkpoint lacks)} of the
    dynamic storages whose tables the checkpoint groups otherwise (as versions before
    SEQUENCE-group fusion did, or before a data_type change split or joined fused
    tables): a storage the checkpoint lacks by name but holds every table of, saved with
    its embedding_dim under other storages, or a storage of the checkpoint that one of
    its tables joins from another. They restore table by table, optimizer state
    included; a table of a storage the checkpoint holds by name that it lacks starts
    empty, as in a whole storage. Everything else is ``check_tables_present``'s."""
    where = saved_logical_tables(meta_tables)
    out = {}
    for storage in sorted(dynamic_tables):
        names = tag_tables.get(storage) or [storage]
        kept = storage in meta_tables
        if kept and all(where.get(name, (storage,))[0] == storage for name in names):
            continue  # restored whole, tags remapped by name
        outcome = Outcome()
        sources, _ = plan_by_name(names, int(dynamic_tables[storage].dim), meta_tables,
                                  ResolvedMap(), {}, outcome)
        if sources and not outcome.differs and (kept or not outcome.missing):
            out[storage] = (sources, outcome.missing)
    return out


def _moved(regrouped: dict[str, tuple[list[TableSource], list[str]]], held: dict[str, str],
           meta_tables: dict[str, Any]) -> dict[str, str]:
    """{table: its storage in the checkpoint} of the tables restored into another one;
    ``held``: {table: its storage in the model}."""
    where = saved_logical_tables(meta_tables)
    return {name: where[name][0] for name, storage in held.items()
            if storage in regrouped and name in where and where[name][0] != storage}


def _note_regrouped(path: str, regrouped: dict[str, tuple[list[TableSource], list[str]]],
                    moved: dict[str, str], tag_tables: dict[str, list[str]]) -> None:
    for storage, (_, missing) in sorted(regrouped.items()):
        joined = [f"{name} (from {moved[name]!r})"
                  for name in tag_tables.get(storage) or [storage] if name in moved]
        logger.info("%s: storage %r restored table by table, the checkpoint grouping its "
                    "tables otherwise: %s", path, storage, ", ".join(joined))
        if missing:
            logger.warning("%s: storage %r: tables not in the checkpoint, start empty: %s",
                           path, storage, missing)


def _note_unread_tables(path: str, saved: dict[str, Any], read: set[str],
                        dense: list[str], left: list[str] = ()) -> None:
    """Warns about saved tables the model has none of (they are not restored); ``read``:
    the saved dynamic storages that the model reads from; ``left``: the tables of those
    read table by table that the model lacks."""
    named = []
    for storage in sorted(set(saved) - read):
        fused = saved[storage].get(TAG_TABLES) or [storage]
        named.append(f"{storage!r} (dynamic)" if fused == [storage]
                     else f"{storage!r} (dynamic, tables {', '.join(fused)})")
    named += [f"{name!r} (dynamic)" for name in left]
    named += [repr(name) for name in dense]
    if named:
        logger.warning(
            "%s: holds tables that no feature of the model reads, not restored: %s. "
            "Checkpoints of HashRec versions that embedded features in no feature group "
            "hold those features' tables; otherwise the feature configs dropped these "
            "tables since the checkpoint was saved", path, ", ".join(named))


def restore_checkpoint(path: str, model: torch.nn.Module | None, dense_optimizer: Any,
                       dynamic_tables: dict[str, Any], restore_optimizer: bool = True,
                       strict: bool = True,
                       tag_tables: dict[str, list[str]] | None = None,
                       read_rank_state: bool = False,
                       keep_every_row: bool = False,
                       read_train_metrics: bool = False) -> dict[str, Any]:
    """Restores a complete checkpoint saved on any number of ranks.

    Call it on every rank (a collective under torch.distributed). Each rank loads
    the dense state and the dynamic-table entries it owns under the current
    world size. Tables should start empty (loading assigns rows; it never clears).

    Args:
        path: a ``model.ckpt-<step>`` directory with its completion marker.
        model: module to load the dense state into (None: skip dense state).
        dense_optimizer: torch optimizer to load (or a sequence of them: the trainer's,
            one per kind), or None.
        dynamic_tables: {table name: HashTable} of this rank; each must be in the checkpoint.
            Saved tables the model has none of (dynamic ones not in ``dynamic_tables``,
            dense and ZCH ones not in ``model``) are not restored, with a warning.
        restore_optimizer: False (fine-tuning) leaves the dense optimizer fresh and resets
            the optimizer-state columns of dynamic and dense (``num_buckets``) tables to
            the optimizer's initial state, so the sparse optimizer may differ.
        strict: passed to ``model.load_state_dict``.
        tag_tables: {table: logical table names in tag order} of the fused tables; rows
            are restored to the tag of the table with the saved name. None takes them
            from ``model.embedding.table_locations()`` when the model has one.
        read_rank_state: read this rank's own state (``save_checkpoint(rank_state=...)``),
            which only a resumed training run uses; False (evaluation, export) leaves
            the file unread, so a damaged one does not stop the restore.
        keep_every_row: for tables nothing trains after the restore (evaluation,
            export): a table that cannot hold every row it owns, because the checkpoint's
            table was nearly full and the keys fill its buckets otherwise under this
            number of ranks (or max_capacity is smaller now), grows past max_capacity
            until it does (``table_io.hold_rows``). False (resuming, fine-tuning) keeps
            the table at max_capacity: the lowest-scored rows of full buckets give way,
            with a warning, as training would evict them.
        read_train_metrics: read the trainer's train metric state
            (``save_checkpoint(train_metrics=...)``), which only a resumed training run
            uses; False leaves the file unread.

    Returns:
        The checkpoint meta (``step``, ``world_size``, ``extra``, ``tables`` ...) plus
        ``loaded``: {table: {"rows": n, "admission": m}} loaded on this rank, and
        ``rank_state``: this rank's ``save_checkpoint(rank_state=...)``, or None where
        ``read_rank_state`` is False, or the checkpoint holds none or was saved by another
        number of ranks; and ``train_metrics_state``: the saved train metric state, or
        None where ``read_train_metrics`` is False or the checkpoint holds none (one
        saved before checkpoints carried it).

    Raises:
        CheckpointError: incomplete, missing, truncated or corrupt files (the rank state
            file only with ``read_rank_state``), or dims / optimizer that do not match;
            the message names the file and table.
    """
    meta = read_complete_meta(path)
    rank, world_size = rank_and_world()
    tag_tables = model_tag_tables(model) if tag_tables is None else tag_tables

    def load() -> dict[str, Any]:
        regrouped = _regrouped(meta["tables"], dynamic_tables, tag_tables)
        whole = {name: table for name, table in dynamic_tables.items() if name not in regrouped}
        check_tables_present(path, meta, whole, tag_tables)
        # saved storages read table by table (by the regrouped storages only)
        sourced = {source.storage for sources, _ in regrouped.values()
                   for source in sources} - set(whole)
        readers = {name: open_table_shards(path, meta, name)
                   for name in sorted(set(whole) | sourced)}
        unread = _restore_dense(path, meta, model, dense_optimizer, restore_optimizer, strict)
        held = model_logical_tables(dynamic_tables, tag_tables)
        moved = _moved(regrouped, held, meta["tables"])
        if rank == 0:
            left = [t for name in sorted(sourced)
                    for t in meta["tables"][name].get(TAG_TABLES) or [name] if t not in held]
            _note_unread_tables(path, meta["tables"], set(readers), unread, left)
            _note_regrouped(path, regrouped, moved, tag_tables)
        loaded = {}
        for name, table in sorted(dynamic_tables.items()):
            if name in regrouped:
                loaded[name] = load_sources(meta["tables"], name, table, regrouped[name][0],
                                            readers, rank, world_size, restore_optimizer,
                                            keep_every_row)
                continue
            where = f"{os.path.join(path, layout.META_NAME)} (table {name!r})"
            remap = tag_remap(where, meta["tables"][name].get(TAG_TABLES), tag_tables.get(name),
                              frozenset(moved))
            loaded[name] = load_table(readers[name], name, table, rank, world_size,
                                      restore_optimizer, remap, keep_every_row=keep_every_row)
            set_table_step(table, meta["tables"][name].get("table_step"))
        state = _read_rank_state(path, meta, rank, world_size) if read_rank_state else None
        metrics = meta.get(layout.TRAIN_METRICS)
        metrics = load_state(path, metrics) if read_train_metrics and metrics else None
        return loaded, state, metrics

    loaded, rank_state, metrics = run_on_all_ranks(load, f"restoring {path}", CheckpointError)
    barrier()
    return {**meta, "loaded": loaded, "rank_state": rank_state,
            "train_metrics_state": metrics}


def _read_rank_state(path: str, meta: dict[str, Any], rank: int,
                     world_size: int) -> dict[str, Any] | None:
    """This rank's saved own state, when the checkpoint was saved by as many ranks; its
    size and checksum are verified where meta.json records them."""
    file = layout.rank_state_path(path, rank, world_size)
    if int(meta["world_size"]) != world_size or not os.path.isfile(file):
        return None
    advice = ("it holds this rank's random generator states for resuming: restore it from "
              "a copy, or delete it to resume with fresh ones (the run then draws other "
              "random numbers than an uninterrupted one would)")
    recorded = meta.get(layout.RANK_STATE_FILES) or []
    if rank < len(recorded) and recorded[rank] is not None:
        try:
            return load_state(os.path.dirname(file), recorded[rank])
        except CheckpointDamagedError as e:
            raise CheckpointError(f"{e}; {advice}") from None
    try:
        return torch.load(file, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unpickling failure means a bad file
        lines = str(e).strip().splitlines()  # the first line: errors are one line
        detail = f"{type(e).__name__}: {lines[0]}" if lines else type(e).__name__
        raise CheckpointError(f"{file}: unreadable ({detail}); {advice}") from None
