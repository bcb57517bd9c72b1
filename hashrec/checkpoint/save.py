"""Atomic checkpoint saves, single-process or under torch.distributed.

Order of a save (no complete checkpoint is ever modified in place):

1. rank 0 creates ``model.ckpt-<step>.tmp`` (a stale one from a crash is removed);
2. every rank streams its shard of each dynamic table into it and fsyncs;
   rank 0 also writes the dense model and optimizer state and the ``train_metrics``
   when given, and each rank its own ``rank_state`` when given;
3. once every rank succeeded, rank 0 writes ``meta.json`` (with the sizes and checksums
   of every rank's ``rank_state`` file), fsyncs the
   directories, renames the temporary directory to ``model.ckpt-<step>``, writes
   the completion marker last, then prunes the oldest complete checkpoints
   beyond ``keep_checkpoint_max`` and what interrupted saves and prunes left.

A save that fails removes its partial files (rank 0, once every rank stopped)
so that a full disk does not stay full, and says when the disk may be full.

A crash at any point leaves the previous complete checkpoint as the latest. All
ranks must see the same ``model_dir`` (one host, or a shared file system).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import time
from collections.abc import Sequence
from typing import Any

import torch

from hashrec.checkpoint import layout
from hashrec.checkpoint.dense import DENSE_TABLES, describe_dense_tables, save_state
from hashrec.checkpoint.dist_util import (
    gather_counts,
    gather_objects,
    rank_and_world,
    run_on_all_ranks,
)
from hashrec.checkpoint.errors import CheckpointError, disk_full_hint
from hashrec.checkpoint.optimizer_state import (
    describe_optimizer,
    optimizer_list,
    write_optimizer_states,
)
from hashrec.checkpoint.shard_file import fsync_dir
from hashrec.checkpoint.table_io import (
    ADMISSION,
    DEFAULT_CHUNK_ROWS,
    ROWS,
    dump_table,
    table_description,
)
from hashrec.checkpoint.tags import TAG_TABLES, model_tag_tables

# Test hook: when set to a path, a rank that has written its shards creates that
# file and then waits, so a test can kill the process in the middle of a save.
PAUSE_ENV = "HASHREC_CHECKPOINT_TEST_PAUSE_FILE"
_PAUSE_SECONDS = 600
_TABLE_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]+$")


def check_table_names(names: list[str]) -> None:
    """Table names become directory names: letters, digits, ``_ . -`` only."""
    for name in names:
        if not _TABLE_NAME_RE.match(name) or name in (".", ".."):
            raise CheckpointError(
                f"table name {name!r} cannot be a checkpoint directory; allowed: letters, "
                f"digits, '_', '.', '-'")


def _check_extra(extra: dict[str, Any] | None) -> dict[str, Any]:
    extra = {} if extra is None else extra
    try:
        json.dumps(extra)
    except (TypeError, ValueError) as e:
        raise CheckpointError(f"extra={extra!r} is not JSON-serializable ({e})") from None
    return extra


def prepare_temp_dir(tmp: str, names: list[str]) -> None:
    """Creates an empty temporary checkpoint directory with one folder per table."""
    if os.path.exists(tmp):
        shutil.rmtree(tmp)  # an interrupted save of this step; never complete
    os.makedirs(os.path.join(tmp, layout.TABLES_DIR))  # also without dynamic tables
    for name in names:
        os.makedirs(os.path.join(tmp, layout.TABLES_DIR, name))


def _pause_for_tests() -> None:
    pause_file = os.environ.get(PAUSE_ENV)
    if not pause_file:
        return
    with open(pause_file, "w", encoding="utf-8") as f:
        f.write(str(os.getpid()))
    time.sleep(_PAUSE_SECONDS)


def _write_rank_files(tmp: str, tables: dict[str, Any], model: torch.nn.Module | None,
                      dense_optimizer: Any, rank: int, world_size: int, chunk_rows: int,
                      tag_tables: dict[str, list[str]], train_metrics: dict[str, Any] | None
                      ) -> tuple[list[int], dict[str, Any]]:
    counts: list[int] = []
    for name in sorted(tables):
        stem = layout.shard_stem(tmp, name, rank, world_size)
        attrs = {"table": name, "rank": rank, "world_size": world_size}
        if name in tag_tables:
            attrs[TAG_TABLES] = tag_tables[name]
        header = dump_table(tables[name], stem, attrs, chunk_rows)
        sections = header["sections"]
        counts += [sections[ROWS]["count"], sections.get(ADMISSION, {}).get("count", 0)]
    dense: dict[str, Any] = {"model": None, "optimizer": None}
    if rank == 0 and model is not None:
        dense["model"] = save_state(model.state_dict(), os.path.join(tmp, layout.MODEL_FILE))
        described = describe_dense_tables(model)
        if described:
            dense["model"][DENSE_TABLES] = described
    if rank == 0:
        dense["optimizer"] = write_optimizer_states(
            tmp, [(o.state_dict(), describe_optimizer(o))
                  for o in optimizer_list(dense_optimizer)])
    if rank == 0 and train_metrics is not None:
        dense[layout.TRAIN_METRICS] = save_state(
            train_metrics, os.path.join(tmp, layout.TRAIN_METRICS_FILE))
    _pause_for_tests()
    return counts, dense


def _meta(step: int, world_size: int, tables: dict[str, Any], counts: list[list[int]],
          dense: dict[str, Any], extra: dict[str, Any], tag_tables: dict[str, list[str]],
          rank_files: list[dict[str, Any] | None]) -> dict[str, Any]:
    described = {}
    for i, name in enumerate(sorted(tables)):
        shards = []
        for rank in range(world_size):
            stem = layout.shard_stem("", name, rank, world_size).lstrip(os.sep)
            shards.append({"stem": stem, "rows": counts[rank][2 * i],
                           "admission": counts[rank][2 * i + 1]})
        described[name] = {**table_description(tables[name], tag_tables.get(name)),
                           "shards": shards,
                           "num_rows": sum(s["rows"] for s in shards),
                           "table_step": getattr(tables[name], "step", None)}
    metrics = dense.pop(layout.TRAIN_METRICS, None)
    meta = {
        "format": layout.FORMAT_NAME, "version": layout.FORMAT_VERSION, "step": step,
        "world_size": world_size, "created_unix": time.time(), "tables": described,
        "dense": dense, "extra": extra,
    }
    if metrics is not None:
        meta[layout.TRAIN_METRICS] = metrics  # file, bytes, xxh3_64
    if any(rank_files):
        meta[layout.RANK_STATE_FILES] = rank_files  # per rank: file, bytes, xxh3_64 (or None)
    return meta


def commit_directory(model_dir: str, tmp: str, final: str, meta: dict[str, Any]) -> None:
    """Writes meta.json into ``tmp``, renames it to ``final``, writes the marker last.

    When ``final`` is already a complete checkpoint (the same step saved again), the
    new copy gets its marker while still named ``tmp``; the old copy is renamed to
    ``<final>.replaced`` and deleted only once the new one is in place. A crash in
    between leaves a complete ``.replaced`` copy, which counts as the step's
    checkpoint (``layout.complete_checkpoints``) until the next save puts it back.
    """
    layout.write_json(os.path.join(tmp, layout.META_NAME), meta)
    for name in meta["tables"]:
        fsync_dir(os.path.join(tmp, layout.TABLES_DIR, name))
    fsync_dir(os.path.join(tmp, layout.TABLES_DIR))
    fsync_dir(tmp)
    marker = {"step": meta["step"], "world_size": meta["world_size"]}
    if not layout.is_complete(final):
        if os.path.exists(final):
            shutil.rmtree(final)  # an interrupted save or prune of this step
        os.rename(tmp, final)
        fsync_dir(model_dir)
        layout.write_marker(final, marker)
        return
    aside = final + layout.REPLACED_SUFFIX
    if os.path.exists(aside):
        shutil.rmtree(aside)  # an older copy; ``final`` is complete
    layout.write_marker(tmp, marker)
    os.rename(final, aside)
    os.rename(tmp, final)
    fsync_dir(model_dir)
    shutil.rmtree(aside)


def save_checkpoint(model_dir: str, step: int, model: torch.nn.Module | None,
                    dense_optimizer: Any, dynamic_tables: dict[str, Any],
                    keep_checkpoint_max: int = 0, extra: dict[str, Any] | None = None,
                    chunk_rows: int = DEFAULT_CHUNK_ROWS,
                    tag_tables: dict[str, list[str]] | None = None,
                    rank_state: dict[str, Any] | None = None,
                    keep: Sequence[str] = (),
                    train_metrics: dict[str, Any] | None = None) -> str:
    """Saves dense state and every rank's dynamic-table shards as ``model.ckpt-<step>``.

    Call it on every rank (a collective under torch.distributed). Rank 0 writes
    the dense state and ``meta.json``; each rank writes its own table shards.

    Args:
        model_dir: directory holding the checkpoints.
        step: global training step; names the checkpoint.
        model: module whose ``state_dict`` is saved (None: no dense state).
        dense_optimizer: torch optimizer whose state is saved (or a sequence of them: the
            trainer's, one per kind), or None.
        dynamic_tables: {table name: HashTable} of this rank, same names on every rank.
        keep_checkpoint_max: keep at most this many complete checkpoints (0: all), and
            ``keep`` (checkpoint paths never pruned) beside them.
        extra: JSON-serializable data stored in meta.json (and returned by restore).
        chunk_rows: rows per streamed chunk (bounds the memory a save needs).
        tag_tables: {table: logical table names in tag order} of fused tables, recorded
            so that restore matches tags by name; None takes them from
            ``model.embedding.table_locations()`` when the model has one.
        rank_state: this rank's own state (tensors, numbers, strings, in dicts and
            lists; e.g. random generator states), written per rank; ``restore_checkpoint``
            returns it under the same world size. None: none.
        train_metrics: the trainer's train metric state, the same on every rank
            (``TrainMetrics.state_dict``, summed over the ranks), written by rank 0 as
            ``train_metrics.pt``; ``restore_checkpoint(read_train_metrics=True)`` returns
            it under any world size. None: none.

    Returns:
        Path of the complete checkpoint.

    Raises:
        CheckpointError: on any rank's failure (on every rank); nothing complete is touched.
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise CheckpointError(f"step={step!r} is not valid; allowed: an int >= 0")
    if chunk_rows < 1:
        raise CheckpointError(f"chunk_rows={chunk_rows!r} is not valid; allowed: >= 1")
    names = sorted(dynamic_tables)
    check_table_names(names)
    extra = _check_extra(extra)
    tag_tables = model_tag_tables(model) if tag_tables is None else tag_tables
    rank, _ = rank_and_world()
    final = layout.checkpoint_path(model_dir, step)
    tmp = final + layout.TEMP_SUFFIX

    def prepare() -> None:
        if rank == 0:
            os.makedirs(model_dir, exist_ok=True)
            prepare_temp_dir(tmp, names)

    run_on_all_ranks(prepare, f"preparing {tmp}", CheckpointError)
    try:
        _write_and_commit(model_dir, step, tmp, final, model, dense_optimizer,
                          dynamic_tables, extra, chunk_rows, tag_tables, rank_state,
                          train_metrics)
    except CheckpointError as e:
        if rank == 0:  # every rank has stopped writing: run_on_all_ranks raised on all
            clean_failed_save(tmp, final)
        hint = "" if "disk may be full" in str(e) else disk_full_hint(e)
        raise CheckpointError(f"{e}{hint} (the partial {tmp} was removed; the previous "
                              f"checkpoints are kept)") from e
    run_on_all_ranks(lambda: layout.prune_checkpoints(model_dir, keep_checkpoint_max, final, keep)
                     if rank == 0 else None, f"pruning {model_dir}", CheckpointError)
    return final


def _write_and_commit(model_dir: str, step: int, tmp: str, final: str,
                      model: torch.nn.Module | None, dense_optimizer: Any,
                      dynamic_tables: dict[str, Any], extra: dict[str, Any], chunk_rows: int,
                      tag_tables: dict[str, list[str]],
                      rank_state: dict[str, Any] | None,
                      train_metrics: dict[str, Any] | None = None) -> None:
    """Steps 2 and 3 of a save (see the module docstring), on every rank."""
    rank, world_size = rank_and_world()

    def write() -> tuple[list[int], dict[str, Any], dict[str, Any] | None]:
        rank_file = None
        if rank_state is not None:
            path = layout.rank_state_path(tmp, rank, world_size)
            os.makedirs(os.path.dirname(path), exist_ok=True)
            rank_file = save_state(rank_state, path)
        return (*_write_rank_files(tmp, dynamic_tables, model, dense_optimizer, rank,
                                   world_size, chunk_rows, tag_tables, train_metrics),
                rank_file)

    counts, dense, rank_file = run_on_all_ranks(write, f"writing shards into {tmp}",
                                                CheckpointError)
    all_counts = gather_counts(counts)
    rank_files = gather_objects(rank_file)

    def commit() -> None:
        if rank == 0:
            commit_directory(model_dir, tmp, final, _meta(
                step, world_size, dynamic_tables, all_counts, dense, extra, tag_tables,
                rank_files))

    run_on_all_ranks(commit, f"committing {final}", CheckpointError)


def clean_failed_save(tmp: str, final: str) -> None:
    """Removes what a failed save (or incremental dump) wrote, a full disk stays full
    otherwise: ``tmp``, and ``final`` unless complete; puts back a previous copy of the
    same step moved aside by ``commit_directory``."""
    try:
        shutil.rmtree(tmp, ignore_errors=True)
        if layout.is_complete(final):
            return
        aside = final + layout.REPLACED_SUFFIX
        shutil.rmtree(final, ignore_errors=True)
        if layout.is_complete(aside):
            os.rename(aside, final)
    except OSError:
        pass  # the save's own error is the one to report; leftovers go at the next prune
