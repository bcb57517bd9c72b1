"""Dense model and optimizer state: ``torch.save`` files read back with ``weights_only``.

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

from hashrec.checkpoint.errors import CheckpointError

logger = logging.getLogger(__name__)

_READ_BLOCK = 16 << 20


def file_digest(path: str) -> str:
    """xxh3-64 hex digest of a file's bytes, read in blocks."""
    digest = xxhash.xxh3_64()
    with open(path, "rb") as f:
        while block := f.read(_READ_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def save_state(state: dict[str, Any], path: str) -> dict[str, Any]:
    """Saves a state dict, fsyncs it, returns {"file", "bytes", "xxh3_64"} for meta.json."""
    with open(path, "wb") as f:
        torch.save(state, f)
        f.flush()
        os.fsync(f.fileno())
    return {"file": os.path.basename(path), "bytes": os.path.getsize(path),
            "xxh3_64": file_digest(path)}


def load_state(root: str, entry: dict[str, Any]) -> dict[str, Any]:
    """Verifies and loads a file described by ``entry`` under ``root`` (weights only)."""
    path = os.path.join(root, entry["file"])
    try:
        size = os.path.getsize(path)
    except OSError:
        raise CheckpointError(f"{path}: dense state file is missing") from None
    if size != entry["bytes"]:
        raise CheckpointError(
            f"{path}: {size} bytes, meta.json says {entry['bytes']} (truncated or overwritten)")
    if file_digest(path) != entry["xxh3_64"]:
        raise CheckpointError(f"{path}: checksum mismatch (file corrupted)")
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except Exception as e:  # noqa: BLE001 - any unpickling failure is a bad file
        raise CheckpointError(f"{path}: cannot be read as weights-only state ({e})") from None


def restore_model(root: str, entry: dict[str, Any], model: torch.nn.Module,
                  strict: bool) -> None:
    """Loads the model state file into ``model``; mismatched names raise CheckpointError."""
    state = load_state(root, entry)
    try:
        result = model.load_state_dict(state, strict=strict)
    except RuntimeError as e:
        raise CheckpointError(
            f"{os.path.join(root, entry['file'])}: does not match the model ({e})") from None
    if result is not None and (result.missing_keys or result.unexpected_keys):
        missing, unexpected = result.missing_keys, result.unexpected_keys
        logger.warning(
            "%s: %d parameters not in checkpoint %s, %d checkpoint entries unused %s",
            entry["file"], len(missing), missing[:5], len(unexpected), unexpected[:5])


def restore_optimizer_state(root: str, entry: dict[str, Any], optimizer: Any) -> None:
    """Loads the dense optimizer state file into ``optimizer``."""
    state = load_state(root, entry)
    try:
        optimizer.load_state_dict(state)
    except (ValueError, KeyError, RuntimeError) as e:
        raise CheckpointError(
            f"{os.path.join(root, entry['file'])}: does not match the dense optimizer ({e}); "
            f"restore without optimizer state to start it fresh") from None
