"""Dense model state: ``torch.save`` files read back with ``weights_only``.

Each file's size and xxh3-64 checksum go into ``meta.json``; loading verifies
them before ``torch.load(..., weights_only=True)``, which never runs code from
the file.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch
import xxhash

from hashrec.checkpoint.errors import CheckpointDamagedError, CheckpointError, disk_full_hint
from hashrec.checkpoint.shard_file import dtype_name
from hashrec.checkpoint.table_io import log_dtype_conversion, optimizer_description
from hashrec.embedding.dense_table import DenseTable

logger = logging.getLogger(__name__)

_READ_BLOCK = 16 << 20
DENSE_TABLES = "dense_tables"
ZCH_REMAPPERS = "zch_remappers"
# Module dicts of an embedding collection holding state per table: dense (``num_buckets``)
# tables' rows and ZCH tables' remappers.
TABLE_DICTS = (DENSE_TABLES, ZCH_REMAPPERS)


def file_digest(path: str) -> str:
    """xxh3-64 hex digest of a file's bytes, read in blocks."""
    digest = xxhash.xxh3_64()
    with open(path, "rb") as f:
        while block := f.read(_READ_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def save_state(state: dict[str, Any], path: str) -> dict[str, Any]:
    """Saves a state dict, fsyncs it, returns {"file", "bytes", "xxh3_64"} for meta.json.

    Raises:
        CheckpointError: the file could not be written (it is removed); says when the
            disk may be full.
    """
    try:
        with open(path, "wb") as f:
            torch.save(state, f)
            f.flush()
            os.fsync(f.fileno())
    except (OSError, RuntimeError) as e:
        # A partial file would keep the disk full; nothing reads it.
        if os.path.exists(path):
            os.remove(path)
        raise CheckpointError(f"{path}: could not be written ({e}){disk_full_hint(e)}") from e
    return {"file": os.path.basename(path), "bytes": os.path.getsize(path),
            "xxh3_64": file_digest(path)}


def load_state(root: str, entry: dict[str, Any]) -> dict[str, Any]:
    """Verifies and loads a file described by ``entry`` under ``root`` (weights only)."""
    path = os.path.join(root, entry["file"])
    try:
        size = os.path.getsize(path)
    except OSError:
        raise CheckpointDamagedError(f"{path}: dense state file is missing") from None
    if size != entry["bytes"]:
        raise CheckpointDamagedError(
            f"{path}: {size} bytes, meta.json says {entry['bytes']} (truncated or overwritten)")
    if file_digest(path) != entry["xxh3_64"]:
        raise CheckpointDamagedError(f"{path}: checksum mismatch (file corrupted)")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unpickling failure is a bad file
        raise CheckpointDamagedError(
            f"{path}: cannot be read as weights-only state ({e})") from None


def dense_table_modules(model: torch.nn.Module) -> dict[str, DenseTable]:
    """State-dict key of each dense (``num_buckets``) table's rows -> the table."""
    return {f"{prefix}.rows": module for prefix, module in model.named_modules()
            if isinstance(module, DenseTable)}


def describe_dense_tables(model: torch.nn.Module) -> dict[str, Any]:
    """Rows key -> {"table", "dim", "row_dim", "dtype", "optimizer"} for meta.json: the rows
    hold optimizer columns after the embedding, so a reader needs the dim to separate them."""
    return {key: {"table": t.name, "dim": int(t.dim), "row_dim": int(t.row_dim),
                  "dtype": dtype_name(t.rows.dtype),
                  "optimizer": optimizer_description(t.optimizer)}
            for key, t in dense_table_modules(model).items()}


def _saved_dim(table: DenseTable, saved: torch.Tensor, described: dict | None) -> int | None:
    if described is not None:
        return int(described["dim"])
    # Checkpoints before the record: the dim that gives this width with the model's
    # sparse optimizer, else the model's dim if some other optimizer gives the width.
    width = int(saved.shape[1])
    for dim in range(1, width + 1):
        if dim + table.optimizer.state_dim(dim) == width:
            return dim
    dim = table.dim
    return dim if width in (dim, dim + 1, 2 * dim, 3 * dim) else None


def rows_difference(table: DenseTable, saved: torch.Tensor, described: dict | None
                    ) -> str | None:
    """Why the saved rows of a dense table do not fit ``table``, in config terms (torch's
    size mismatch counts optimizer columns as embedding), or None when they fit."""
    if saved.dim() != 2 or int(saved.shape[0]) != table.num_rows:
        rows = int(saved.shape[0]) if saved.dim() else "no"
        return f"{rows} rows in the checkpoint, {table.num_rows} (num_buckets) in the config"
    saved_dim = _saved_dim(table, saved, described)
    if saved_dim != table.dim:
        shown = saved_dim if saved_dim is not None else f"other than {table.dim}"
        return (f"embedding_dim {shown} in the checkpoint, {table.dim} in the config "
                f"(rows {int(saved.shape[1])} wide with sparse optimizer state)")
    return None


def in_table_dtype(table: DenseTable, saved: torch.Tensor) -> torch.Tensor:
    """Saved rows in the table's dtype, with an INFO line when saved in another."""
    if saved.dtype == table.rows.dtype:
        return saved
    log_dtype_conversion(table.name, dtype_name(saved.dtype), dtype_name(table.rows.dtype))
    return saved.to(table.rows.dtype)


def embedding_rows(table: DenseTable, saved: torch.Tensor) -> torch.Tensor:
    """Saved rows that fit ``table``, in its dtype, with their optimizer columns reset to
    the model's sparse optimizer's initial state."""
    saved = in_table_dtype(table, saved)
    state = table.optimizer.initial_state(table.dim).reshape(1, -1).to(saved.dtype)
    return torch.cat([saved[:, :table.dim], state.expand(saved.shape[0], state.shape[1])], 1)


def _dense_rows(path: str, key: str, table: DenseTable, saved: torch.Tensor,
                restore_optimizer: bool, described: dict | None) -> torch.Tensor:
    """The saved rows of a dense table as the model needs them (in the table's dtype, with
    an INFO line when saved in another), or a CheckpointError in config terms."""
    where = f"{path}: dense table {table.name!r} ({key})"
    difference = rows_difference(table, saved, described)
    if difference is not None:
        raise CheckpointError(f"{where}: {difference}; restore with the feature configs it "
                              f"was saved with (the model_dir's pipeline.config)")
    if not restore_optimizer:
        return embedding_rows(table, saved)
    if int(saved.shape[1]) != table.row_dim:
        saved_opt = ((described or {}).get("optimizer") or {}).get("type", "another")
        raise CheckpointError(
            f"{where}: sparse optimizer {saved_opt} ({int(saved.shape[1]) - table.dim} "
            f"state columns) in the checkpoint, {type(table.optimizer).__name__} "
            f"({table.row_dim - table.dim}) in the model; restore without optimizer "
            f"state (--ignore_restore_optimizer) to reset it")
    return in_table_dtype(table, saved)


def _tables_held(modules: dict[str, torch.nn.Module], parent: str) -> set[str]:
    """The tables of the embedding module at ``parent``: dense (``num_buckets``) and ZCH."""
    held: set[str] = set()
    for name in TABLE_DICTS:
        holder = modules.get(f"{parent}.{name}" if parent else name)
        if isinstance(holder, torch.nn.ModuleDict):
            held.update(holder.keys())
    return held


def _pop_unread_tables(state: dict[str, Any], model: torch.nn.Module) -> list[str]:
    """Removes from ``state`` the entries of dense and ZCH tables that the model has none
    of (a table no feature of the model reads); returns those tables' names, sorted.

    A table the model still has, as another kind (a ZCH table that is a ``num_buckets``
    one now), keeps its entries: the strict load then names them as unexpected."""
    modules = dict(model.named_modules())
    expected = model.state_dict().keys()
    unread = set()
    for key in [k for k in state if k not in expected]:
        parts = key.split(".")
        for i, part in enumerate(parts[:-2]):
            holder = modules.get(".".join(parts[:i + 1])) if part in TABLE_DICTS else None
            if isinstance(holder, torch.nn.ModuleDict):
                if parts[i + 1] not in _tables_held(modules, ".".join(parts[:i])):
                    unread.add(parts[i + 1])
                    del state[key]
                break
    return sorted(unread)


def restore_model(root: str, entry: dict[str, Any], model: torch.nn.Module,
                  strict: bool, restore_optimizer: bool = True
                  ) -> tuple[list[str], list[str]]:
    """Loads the model state file into ``model``; mismatched names raise CheckpointError.

    Dense (``num_buckets``) tables keep optimizer columns in their rows; with
    ``restore_optimizer`` False only their embedding columns are loaded and the
    optimizer columns start from the model's sparse optimizer's initial state.
    Saved dense and ZCH tables that the model has none of are not loaded.

    Returns:
        The names of the saved dense and ZCH tables not loaded, and the saved entries
        that a module's load hook took in although the model holds no such entry (a
        bias an MLP's linear layer before batch norm had: the norm's running mean takes
        it).
    """
    path = os.path.join(root, entry["file"])
    state = load_state(root, entry)
    unread = _pop_unread_tables(state, model)
    own = model.state_dict()
    absorbed = [key for key in state if key not in own]
    described = entry.get(DENSE_TABLES) or {}
    for key, table in dense_table_modules(model).items():
        if key in state:
            state[key] = _dense_rows(path, key, table, state[key], restore_optimizer,
                                     described.get(key))
    try:
        result = model.load_state_dict(state, strict=strict)
    except RuntimeError as e:
        detail = _mismatch(state, model) or str(e).strip().splitlines()[0]
        raise CheckpointError(
            f"{path}: does not match the model ({detail}); restore with the config the "
            f"checkpoint was saved with (the model_dir's pipeline.config), or start from it "
            f"with --fine_tune_checkpoint, which restores what fits a changed model") from None
    if result is not None and (result.missing_keys or result.unexpected_keys):
        missing, unexpected = result.missing_keys, result.unexpected_keys
        logger.warning(
            "%s: %d parameters not in checkpoint %s, %d checkpoint entries unused %s",
            entry["file"], len(missing), missing[:5], len(unexpected), unexpected[:5])
    unused = set(result.unexpected_keys) if result is not None else set()
    return unread, [key for key in absorbed if key not in unused]


def _mismatch(state: dict[str, Any], model: torch.nn.Module) -> str:
    """What differs between a saved state and the model's, in a few names: entries the
    model lacks, entries the checkpoint lacks and shapes that differ, each counted and
    grouped under their top-level modules ("" when the names and shapes agree)."""
    own = model.state_dict()
    parts = []
    for what, names in (("the model lacks", [k for k in state if k not in own]),
                        ("the checkpoint lacks", [k for k in own if k not in state])):
        if names:
            parts.append(f"{len(names)} entries {what}, under {_prefixes(names)}: "
                         f"{', '.join(names[:3])}{', ...' if len(names) > 3 else ''}")
    shapes = [f"{k} {tuple(state[k].shape)} saved, {tuple(own[k].shape)} here"
              for k in state if k in own and hasattr(state[k], "shape")
              and hasattr(own[k], "shape") and tuple(state[k].shape) != tuple(own[k].shape)]
    if shapes:
        parts.append(f"{len(shapes)} shapes differ: {'; '.join(shapes[:3])}"
                     f"{'; ...' if len(shapes) > 3 else ''}")
    return "; ".join(parts)


def _prefixes(names: list[str]) -> str:
    """The distinct first three name parts of ``names`` (``towers.deep.0``), four at most."""
    found = list(dict.fromkeys(".".join(n.split(".")[:3]) for n in names))
    return ", ".join(found[:4]) + (", ..." if len(found) > 4 else "")
