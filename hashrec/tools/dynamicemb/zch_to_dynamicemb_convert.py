"""Convert a checkpoint of a model with ``zch`` features into one for ``dynamicemb``.

Usage::

    python -m hashrec.tools.dynamicemb.zch_to_dynamicemb_convert \\
        --source_checkpoint_path C/model.ckpt-N --source_pipeline_config_path P1 \\
        --target_pipeline_config_path P2 --save_dir S [--world_size W]

The target config is the source config with ``zch {}`` replaced by ``dynamicemb {}`` on
the same features (same table names and embedding_dim). The tool writes
``S/model.ckpt-0``, sharded for ``W`` ranks (default: the source checkpoint's world
size); train from it with ``train_eval --fine_tune_checkpoint S/model.ckpt-0``.

What migrates:

* ZCH embeddings: every raw id holding a ZCH slot becomes a key of the target's
  dynamic table with that slot's embedding row. Ids without a slot (waiting for
  one) read zeros in the source and are not migrated, so they read the target's
  eval initializer (0 by default) in eval and start fresh in training.
* Scores of migrated ids: the slot's access count for an LFU target, the step of
  its last access for a STEP target (the table's step clock continues from the
  remapper's step); other strategies start with fresh scores (TIMESTAMP the
  current time, CUSTOMIZED and NO_EVICTION 0).
* Dense layers, dense tables, non-ZCH dynamic tables (rows with their optimizer
  state and scores, re-tagged and re-sharded for the target's fusion and world
  size) and the dense optimizer state are kept.

What does not: the ZCH tables' optimizer state (the target rows start with the
sparse optimizer's initial state) and admission counters of dynamic tables.
"""

from __future__ import annotations

import argparse
import logging
import sys

import torch

from hashrec.checkpoint import restore_checkpoint
from hashrec.checkpoint.dense import load_state
from hashrec.checkpoint.optimizer_state import saved_optimizers
from hashrec.checkpoint.restore import read_complete_meta
from hashrec.checkpoint.table_io import initial_scores
from hashrec.checkpoint.tags import model_tag_tables
from hashrec.config import load_pipeline_config
from hashrec.table.options import ScoreStrategy
from hashrec.tools.dynamicemb.ckpt_writer import CheckpointBuilder, initial_state_rows
from hashrec.tools.dynamicemb.cli import run_tool, world_size_arg
from hashrec.tools.dynamicemb.errors import MigrationError

logger = logging.getLogger("hashrec.tools")

_CHUNK_ROWS = 1 << 18


def _zch_rows(name: str, source_embedding, target_table) -> dict[str, torch.Tensor]:
    remapper = source_embedding.zch_remappers[name]
    dense = source_embedding.dense_tables[name]
    if dense.dim != target_table.dim:
        raise MigrationError(
            f"table {name!r}: embedding_dim {dense.dim} in the source, {target_table.dim} in "
            f"the target; keep embedding_dim when replacing zch by dynamicemb")
    keys, slots, counts, last = remapper.assigned()
    strategy = target_table.options.score_strategy
    if strategy is ScoreStrategy.LFU:
        scores = counts.clamp(min=1)
    elif strategy is ScoreStrategy.STEP:
        scores = last
    else:
        scores = initial_scores(target_table, keys.numel())
    rows = initial_state_rows(target_table, dense.rows[slots, :dense.dim].detach())
    return {"keys": keys, "rows": rows, "scores": scores, "step": int(remapper.step)}


def _same_optimizer(source_table, target_table) -> bool:
    return (type(source_table.options.optimizer) is type(target_table.options.optimizer)
            and source_table.row_dim == target_table.row_dim)


def _copy_dynamic(builder: CheckpointBuilder, name: str, source_table, source_tag: int,
                  target_storage: str, target_tag: int, target_table) -> int:
    """Copies one logical table's entries between storages; returns the rows copied."""
    if source_table.dim != target_table.dim:
        raise MigrationError(f"table {name!r}: embedding_dim {source_table.dim} in the source, "
                             f"{target_table.dim} in the target")
    keep_state = _same_optimizer(source_table, target_table)
    keep_scores = source_table.options.score_strategy is target_table.options.score_strategy
    copied = 0
    for keys, tags, rows, scores in source_table.export_state(_CHUNK_ROWS):
        mine = tags == source_tag
        keys, rows, scores = keys[mine], rows[mine], scores[mine]
        if not keep_state:
            rows = initial_state_rows(target_table, rows[:, :source_table.dim])
        if not keep_scores:
            scores = initial_scores(target_table, keys.numel())
        builder.write_rows(target_storage, keys,
                           torch.full((keys.numel(),), target_tag, dtype=torch.int32),
                           rows.to(target_table.options.dtype), scores)
        copied += int(keys.numel())
    return copied


def _zch_state_keys(name: str) -> tuple[str, str]:
    return f"embedding.dense_tables.{name}.", f"embedding.zch_remappers.{name}."


def _dense_state(source_model, target_model, zch_tables: list[str]) -> dict[str, torch.Tensor]:
    """The target's state_dict filled with every source entry of the same name and shape."""
    prefixes = tuple(p for name in zch_tables for p in _zch_state_keys(name))
    source = {k: v for k, v in source_model.state_dict().items() if not k.startswith(prefixes)}
    state = {}
    for key, initial in target_model.state_dict().items():
        value = source.pop(key, None)
        if value is None:
            logger.warning("%s: not in the source checkpoint; kept at its initial value", key)
            value = initial
        elif value.shape != initial.shape:
            raise MigrationError(f"{key}: shape {tuple(value.shape)} in the source, "
                                 f"{tuple(initial.shape)} in the target model")
        elif value.dtype != initial.dtype:  # a dense table's data_type changed
            logger.info("%s: %s in the source, stored as %s for the target", key,
                        value.dtype, initial.dtype)
            value = value.to(initial.dtype)
        state[key] = value
    if source:
        logger.warning("dropped %d source entries the target model lacks: %s", len(source),
                       sorted(source)[:5])
    return state


def _dense_optimizer_state(path: str, meta: dict, source_model, target_model):
    entry = meta["dense"].get("optimizer")
    if entry is None:
        return None
    shapes = lambda m: [tuple(p.shape) for p in m.parameters()]  # noqa: E731
    if shapes(source_model) != shapes(target_model):
        logger.warning("dense parameters differ between source and target; the dense "
                       "optimizer state is not kept")
        return None
    return [(load_state(path, saved), {k: saved[k] for k in ("type", "hyperparameters")
                                       if k in saved})
            for saved in saved_optimizers(entry)]


def _migrate_zch(builder: CheckpointBuilder, name: str, source_embedding, storage: str,
                 tag: int, table) -> int:
    """Writes ZCH table ``name``'s slot rows as the target storage's keys; -> ids migrated."""
    part = _zch_rows(name, source_embedding, table)
    builder.write_rows(storage, part["keys"],
                       torch.full((part["keys"].numel(),), tag, dtype=torch.int32),
                       part["rows"], part["scores"])
    if table.options.score_strategy is ScoreStrategy.STEP:
        builder.table_steps[storage] = max(builder.table_steps[storage], part["step"])
    count = int(part["keys"].numel())
    logger.info("table %r: %d ZCH ids migrated", name, count)
    return count


def _fill_tables(builder: CheckpointBuilder, source, target, zch_tables: list[str]) -> dict:
    """Every dynamic table of the target collection into ``builder``: ZCH tables of the
    source migrated, dynamic ones copied, others left empty (with a warning). Returns the
    ZCH tables' migration records by name."""
    storages = target.dynamic_tables()
    source_locations = source.table_locations()
    source_storages = source.dynamic_tables()
    migrated = {}
    for name, (storage, tag) in target.table_locations().items():
        if storage not in storages:
            continue
        table = storages[storage]
        if name in zch_tables:
            migrated[name] = _migrate_zch(builder, name, source, storage, tag, table)
            continue
        source_storage, source_tag = source_locations.get(name, (None, 0))
        if source_storage not in source_storages:
            logger.warning("table %r: dynamic in the target but not in the source; it "
                           "starts empty", name)
            continue
        source_table = source_storages[source_storage]
        copied = _copy_dynamic(builder, name, source_table, source_tag, storage, tag, table)
        builder.table_steps[storage] = max(builder.table_steps[storage], int(source_table.step))
        logger.info("table %r: %d rows kept", name, copied)
    return migrated


def convert(source_checkpoint: str, source_config, target_config, save_dir: str,
            world_size: int | None = None) -> str:
    """Writes ``save_dir/model.ckpt-0`` for the target config (see the module docstring).

    Returns:
        The checkpoint path.

    Raises:
        MigrationError: the source has no ZCH table, or a ZCH table is not dynamic in the
            target, or dims differ.
        CheckpointError: unreadable source, existing target checkpoint.
    """
    from hashrec.train.session import build_session

    meta = read_complete_meta(source_checkpoint)
    world_size = int(world_size or meta["world_size"])
    cpu = torch.device("cpu")
    source = build_session(source_config, device=cpu, purpose="zch_to_dynamicemb_convert").model
    # The configs are checked before the source is read: restored into a model that is
    # not the source's (the configs swapped, say), it would only warn of tables it lacks.
    zch_tables = list(source.embedding.zch_remappers.keys())
    if not zch_tables:
        raise MigrationError("the source config has no zch feature; nothing to convert "
                             "(--source_pipeline_config_path is the config with zch, "
                             "--target_pipeline_config_path the one with dynamicemb)")
    target = build_session(target_config, device=cpu, purpose="zch_to_dynamicemb_convert").model
    storages = target.embedding.dynamic_tables()
    locations = target.embedding.table_locations()
    for name in zch_tables:
        if name not in locations or locations[name][0] not in storages:
            raise MigrationError(f"table {name!r}: zch in the source but not a dynamicemb table "
                                 f"in the target config; replace zch by dynamicemb on it")
    # the source is only read: its dynamic tables keep every row, past max_capacity if
    # the keys of a checkpoint saved on several ranks fill one process's buckets unevenly
    restore_checkpoint(source_checkpoint, source, None, source.embedding.dynamic_tables(),
                       keep_every_row=True)
    builder = CheckpointBuilder(save_dir, world_size, storages,
                                tag_tables=model_tag_tables(target))
    try:
        migrated = _fill_tables(builder, source.embedding, target.embedding, zch_tables)
        state = _dense_state(source, target, zch_tables)
        optimizer = _dense_optimizer_state(source_checkpoint, meta, source, target)
        final = builder.commit(state, optimizer, {
            "converted_from": source_checkpoint, "source_step": int(meta["step"]),
            "zch_tables": migrated})
    except BaseException:
        builder.abort()
        raise
    logger.info("wrote %s for world_size %d", final, world_size)
    return final


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m hashrec.tools.dynamicemb.zch_to_dynamicemb_convert",
        description="Convert a checkpoint of a model with zch features into <save_dir>/"
                    "model.ckpt-0 for the same model with dynamicemb on those features.")
    parser.add_argument("--source_checkpoint_path", required=True,
                        help="the zch model's checkpoint directory (.../model.ckpt-N)")
    parser.add_argument("--source_pipeline_config_path", required=True,
                        help="the config the source was trained with (zch features)")
    parser.add_argument("--target_pipeline_config_path", required=True,
                        help="the same config with zch replaced by dynamicemb")
    parser.add_argument("--save_dir", required=True, help="directory of the new checkpoint")
    parser.add_argument("--world_size", type=world_size_arg, default=None,
                        help="shards of the new checkpoint (default: the source's world size; "
                             "a product such as 2*8 is multiplied)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return run_tool(args.world_size, lambda: convert(
        args.source_checkpoint_path, load_pipeline_config(args.source_pipeline_config_path),
        load_pipeline_config(args.target_pipeline_config_path), args.save_dir,
        args.world_size))


if __name__ == "__main__":
    sys.exit(main())
