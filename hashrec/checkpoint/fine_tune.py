"""Fine-tuning start: restore what of a checkpoint fits the model, start the rest fresh.

``restore_fine_tune`` is the partial counterpart of ``restore_checkpoint`` for a model
whose config changed since the checkpoint was saved (a feature, a tower or an MLP
added or changed). Dense parts the checkpoint holds in the same shape are restored
(``partial_dense``), and so are the rows of the dynamic tables it holds with the same
embedding_dim (``partial_tables``, on any number of ranks); everything else keeps its
fresh initialization, dynamic tables start empty, and rank 0 logs one summary of
what came from where (``fine_tune_report``). A part whose shape or kind changed starts
fresh too, named with the shapes in that summary (a WARNING): refusing it would leave
no way to fine-tune a model whose MLP grew. Optimizer state is never restored: the
dense optimizer stays fresh and tables' optimizer columns start from the optimizer's
initial state. ``param_map`` (``fine_tune_ckpt_param_map``) renames parts. Resuming a
run (``--continue_train``) keeps the strict ``restore_checkpoint``.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from hashrec.checkpoint.dense import DENSE_TABLES, dense_table_modules, load_state
from hashrec.checkpoint.dist_util import barrier, rank_and_world, run_on_all_ranks
from hashrec.checkpoint.errors import CheckpointError
from hashrec.checkpoint.fine_tune_report import summary
from hashrec.checkpoint.param_map import (
    DYNAMIC,
    Names,
    ParamMap,
    ResolvedMap,
    resolve_param_map,
)
from hashrec.checkpoint.partial_dense import DensePlan, plan_dense, table_kinds
from hashrec.checkpoint.partial_tables import (
    TableSource,
    load_sources,
    model_logical_tables,
    plan_tables,
    saved_logical_tables,
)
from hashrec.checkpoint.restore import open_table_shards, read_complete_meta
from hashrec.checkpoint.shard_file import ShardReader
from hashrec.checkpoint.tags import model_tag_tables

logger = logging.getLogger(__name__)


def _model_names(own: dict[str, Any], dynamic_tables: dict[str, Any],
                 tag_tables: dict[str, list[str]]) -> Names:
    tables = table_kinds(own)
    tables.update(dict.fromkeys(model_logical_tables(dynamic_tables, tag_tables), DYNAMIC))
    return Names(tables, frozenset(own))


def _checkpoint_names(meta: dict[str, Any], saved: dict[str, Any]) -> Names:
    tables = table_kinds(saved)
    tables.update(dict.fromkeys(saved_logical_tables(meta["tables"]), DYNAMIC))
    return Names(tables, frozenset(saved))


def _kinds_differ(model: Names, checkpoint: Names, resolved: ResolvedMap) -> dict[str, str]:
    """{table: why} of the model's tables whose checkpoint table is of another kind."""
    differ = {}
    for name, kind in sorted(model.tables.items()):
        source = resolved.source_table(name)
        theirs = checkpoint.tables.get(source)
        if theirs is not None and theirs != kind:
            named = "" if source == name else f" ({source})"
            differ[name] = f"a {kind} table here, {theirs} in the checkpoint{named}"
    return differ


def _load_tables(meta: dict[str, Any], dynamic_tables: dict[str, Any],
                 sources: dict[str, list[TableSource]], readers: dict[str, list[ShardReader]],
                 rank: int, world_size: int) -> dict[str, dict[str, int]]:
    """Loads each model storage's sources, optimizer state reset; returns {storage:
    {"rows", "admission"}}."""
    return {storage: load_sources(meta["tables"], storage, dynamic_tables[storage],
                                  storage_sources, readers, rank, world_size,
                                  restore_optimizer=False)
            for storage, storage_sources in sorted(sources.items())}


def _nothing_fits(path: str) -> str:
    """The error of a fine-tune checkpoint that holds no part of the model (another
    model's, as a rule): training from it would be training from scratch."""
    return (f"{path}: fine-tuning would restore nothing: the checkpoint holds none of this "
            f"model's layers or tables in the same shape under the same names (a checkpoint "
            f"of another model?); pass a checkpoint of this model, map renamed parts with "
            f"train_config.fine_tune_ckpt_param_map, or leave the fine-tune checkpoint out "
            f"to start fresh")


def restore_fine_tune(path: str, model: torch.nn.Module | None,
                      dynamic_tables: dict[str, Any], param_map: ParamMap | None = None,
                      tag_tables: dict[str, list[str]] | None = None) -> dict[str, Any]:
    """Restores what of checkpoint ``path`` fits the model; the rest starts fresh.

    Call it on every rank (a collective under torch.distributed); the checkpoint may
    have been saved on any number of ranks. Dynamic tables should start empty.

    Args:
        path: a ``model.ckpt-<step>`` directory with its completion marker.
        model: module whose dense state is restored in part (None: skip dense state).
        dynamic_tables: {storage name: HashTable} of this rank.
        param_map: names of this model's parts in the checkpoint, where they differ.
        tag_tables: {storage: logical tables in tag order}; None takes them from
            ``model.embedding.table_locations()`` when the model has one.

    Returns:
        The checkpoint meta plus ``loaded``: {storage: {"rows": n, "admission": m}}
        loaded on this rank.

    Raises:
        CheckpointError: an incomplete, missing or corrupt checkpoint, or a param map
            naming something the model or the checkpoint does not hold.
    """
    meta = read_complete_meta(path)
    rank, world_size = rank_and_world()
    tag_tables = model_tag_tables(model) if tag_tables is None else tag_tables

    def load() -> tuple[dict[str, Any], tuple[int, str]]:
        entry = meta["dense"]["model"]
        saved = load_state(path, entry) if model is not None and entry is not None else {}
        own = model.state_dict() if model is not None else {}
        model_names = _model_names(own, dynamic_tables, tag_tables)
        checkpoint_names = _checkpoint_names(meta, saved)
        resolved = resolve_param_map(param_map, model_names, checkpoint_names)
        differ = _kinds_differ(model_names, checkpoint_names, resolved)
        dense = DensePlan()
        if model is not None:
            dense = plan_dense(own, saved, (entry or {}).get(DENSE_TABLES) or {}, resolved,
                               dense_table_modules(model), differ)
        sources, tables = plan_tables(meta["tables"], dynamic_tables, tag_tables, resolved,
                                      differ)
        if not any((dense.modules.restored, dense.modules.renamed, dense.tables.restored,
                    dense.tables.renamed, tables.restored, tables.renamed)):
            raise CheckpointError(_nothing_fits(path))
        # every shard checked before anything of the model changes
        readers = {source.storage: open_table_shards(path, meta, source.storage)
                   for storage_sources in sources.values() for source in storage_sources}
        if model is not None:
            model.load_state_dict(dense.state, strict=False)
        loaded = _load_tables(meta, dynamic_tables, sources, readers, rank, world_size)
        tables = dense.tables.merge(tables)
        # a table of another kind now is named once, as differing
        tables.unused = [name for name in tables.unused
                         if name not in {resolved.source_table(other) for other in differ}]
        return loaded, summary(path, dense.modules, tables, dense.model_modules,
                               dense.saved_modules)

    loaded, (level, message) = run_on_all_ranks(load, f"restoring {path} to fine-tune",
                                                CheckpointError)
    if rank == 0:
        logger.log(level, "%s", message)
    barrier()
    return {**meta, "loaded": loaded}
