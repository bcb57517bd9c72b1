"""Writing a ``model.ckpt-0`` directory for a chosen world size without training.

The migration tools build the target model (to learn its storages, fusion tags,
optimizer and dense state), then stream rows into :class:`CheckpointBuilder`:
each key goes to the shard of ``owner_of(key, world_size)``, exactly where
``save_checkpoint`` running on that many ranks would have put it, so
``restore_checkpoint`` (and ``train_eval --fine_tune_checkpoint``) load it on any
world size. The directory is committed like a saved checkpoint: a temporary
directory, ``meta.json``, a rename, the completion marker last.
"""

from __future__ import annotations

import math
import os
import shutil
import time
from typing import Any

import torch

from hashrec.checkpoint import CheckpointError, layout
from hashrec.checkpoint.dense import save_state
from hashrec.checkpoint.optimizer_state import write_optimizer_states
from hashrec.checkpoint.save import check_table_names, commit_directory, prepare_temp_dir
from hashrec.checkpoint.shard_file import ShardWriter
from hashrec.checkpoint.table_io import ROWS, table_description
from hashrec.table.hashing import owner_of
from hashrec.table.options import ScoreStrategy


def initial_state_rows(table: Any, embeddings: torch.Tensor) -> torch.Tensor:
    """Full rows ``[embedding | optimizer initial state]`` in the table's dtype."""
    spec = table.options.optimizer
    rows = embeddings.to(torch.float32)
    if spec is not None and spec.state_dim(table.dim):
        state = spec.initial_state(table.dim).reshape(1, -1).to(torch.float32)
        rows = torch.cat([rows, state.expand(rows.shape[0], state.shape[1])], dim=1)
    return rows.to(table.options.dtype)


class CheckpointBuilder:
    """Streams rows of dynamic storages into a new checkpoint ``save_dir/model.ckpt-<step>``.

    Args:
        save_dir: directory that receives the checkpoint.
        world_size: number of shards per storage (the training world size).
        storages: {storage name: HashTable of the target model}; every storage gets a
            shard per rank, empty if no row is written to it.
        step: the checkpoint's step (0 for a starting point).
        tag_tables: {storage: logical table names in tag order} of the target model,
            recorded so that restore matches fused tables' tags by name.

    Raises:
        CheckpointError: the checkpoint exists already, ``save_dir`` is a file, or a bad
            world size.
    """

    def __init__(self, save_dir: str, world_size: int, storages: dict[str, Any],
                 step: int = 0, tag_tables: dict[str, list[str]] | None = None) -> None:
        if world_size < 1:
            raise CheckpointError(f"world_size={world_size} is not valid; allowed: >= 1")
        if os.path.exists(save_dir) and not os.path.isdir(save_dir):
            raise CheckpointError(f"--save_dir {save_dir!r} is a file; name a new or empty "
                                  f"directory for the checkpoint")
        self.final = layout.checkpoint_path(save_dir, step)
        if os.path.exists(self.final):
            raise CheckpointError(f"{self.final}: already exists; choose an empty --save_dir "
                                  f"(existing checkpoints are never overwritten)")
        check_table_names(sorted(storages))
        self.save_dir, self.world_size, self.step = save_dir, world_size, step
        self.storages = dict(storages)
        self.tag_tables = dict(tag_tables or {})
        self.tmp = self.final + layout.TEMP_SUFFIX
        try:
            os.makedirs(save_dir, exist_ok=True)
        except OSError as err:
            raise CheckpointError(f"--save_dir {save_dir!r}: cannot create it: "
                                  f"{err.strerror}") from None
        self._writers: dict[str, list[ShardWriter]] = {}
        self.table_steps: dict[str, int] = {name: 0 for name in storages}
        try:  # a Ctrl-C meanwhile leaves no temporary directory
            prepare_temp_dir(self.tmp, sorted(storages))
            for name, table in storages.items():
                writers = self._writers.setdefault(name, [])
                for rank in range(world_size):
                    stem = layout.shard_stem(self.tmp, name, rank, world_size)
                    attrs = {"table": name, "rank": rank, "world_size": world_size,
                             **table_description(table, self.tag_tables.get(name))}
                    writers.append(ShardWriter(stem, attrs))
                    writers[-1].ensure_section(ROWS)
        except BaseException:
            self.abort()
            raise
        self.rows_per_rank = {name: [0] * world_size for name in storages}

    def write_rows(self, storage: str, keys: torch.Tensor, tags: torch.Tensor,
                   rows: torch.Tensor, scores: torch.Tensor) -> None:
        """Appends entries (keys (n,) int64, tags (n,) int32, rows (n, row_dim), scores (n,))."""
        if keys.numel() == 0:
            return
        owners = owner_of(keys, self.world_size)
        for rank in torch.unique(owners).tolist():
            mine = owners == rank
            self._writers[storage][rank].write_chunk(ROWS, {
                "keys": keys[mine], "tags": tags[mine].to(torch.int32),
                "rows": rows[mine].contiguous(), "scores": scores[mine].to(torch.int64)})
            self.rows_per_rank[storage][rank] += int(mine.sum())

    def check_capacity(self) -> None:
        """Every rank's share must fit a rank's part of its storage's ``max_capacity``
        (the capacity over all ranks: a rank holds ``ceil(max_capacity / world_size)``).

        Raises:
            CheckpointError: naming each storage over, its fullest rank and the counts;
                where every such storage's rows fit one rank and it evicts, that way
                round (a restore on more ranks keeps each rank's highest-scored rows).
        """
        over, one_rank = [], True
        for name, counts in self.rows_per_rank.items():
            options = self.storages[name].options
            total = int(options.max_capacity)
            capacity = math.ceil(total / self.world_size)
            worst = max(range(self.world_size), key=lambda r: counts[r])
            if counts[worst] > capacity:
                over.append(f"storage {name!r}: rank {worst} of {self.world_size} would hold "
                            f"{counts[worst]} rows but a rank holds at most {capacity} "
                            f"(max_capacity {total} over {self.world_size} ranks)")
                one_rank = one_rank and sum(counts) <= total and \
                    options.score_strategy is not ScoreStrategy.NO_EVICTION
        if over:
            raise CheckpointError("; ".join(over) + "; raise max_capacity" + (
                f", or write the checkpoint for one rank (--world_size 1), which holds "
                f"every row, and restore that on {self.world_size}: a restore keeps each "
                f"rank's highest-scored rows, with a warning naming those lost"
                if one_rank else ""))

    def abort(self) -> None:
        """Closes the shards and removes the temporary directory (nothing is committed)."""
        for writers in self._writers.values():
            for writer in writers:
                writer.abort()
        shutil.rmtree(self.tmp, ignore_errors=True)

    def commit(self, model_state: dict[str, Any] | None,
               optimizer_states: list[tuple[dict, dict]] | None = None,
               extra: dict[str, Any] | None = None) -> str:
        """Closes the shards, writes the dense state and meta.json, marks the checkpoint done.

        Args:
            model_state: the model's ``state_dict`` to store as dense state (None: none).
            optimizer_states: the dense optimizers' state dicts to store, each with its
                description (``optimizer_state.describe_optimizer``; None: none).
            extra: JSON-serializable data for meta.json.

        Returns:
            The checkpoint path.
        """
        self.check_capacity()
        tables = {}
        for name, writers in self._writers.items():
            shards = []
            for rank, writer in enumerate(writers):
                count = writer.close()["sections"][ROWS]["count"]
                stem = layout.shard_stem("", name, rank, self.world_size).lstrip(os.sep)
                shards.append({"stem": stem, "rows": count, "admission": 0})
            tables[name] = {**table_description(self.storages[name], self.tag_tables.get(name)),
                            "shards": shards,
                            "num_rows": sum(s["rows"] for s in shards),
                            "table_step": self.table_steps[name]}
        dense: dict[str, Any] = {"model": None, "optimizer": None}
        if model_state is not None:
            dense["model"] = save_state(model_state, os.path.join(self.tmp, layout.MODEL_FILE))
        dense["optimizer"] = write_optimizer_states(self.tmp, optimizer_states or [])
        meta = {"format": layout.FORMAT_NAME, "version": layout.FORMAT_VERSION,
                "step": self.step, "world_size": self.world_size,
                "created_unix": time.time(), "tables": tables, "dense": dense,
                "extra": extra or {}}
        commit_directory(self.save_dir, self.tmp, self.final, meta)
        return self.final
