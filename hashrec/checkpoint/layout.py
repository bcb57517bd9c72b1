"""Where checkpoint files live and which checkpoints count as complete.

::

    model_dir/
      model.ckpt-<step>/            complete once DONE exists (written last)
        meta.json                   step, world size, tables, dims, format version
        model.pt  optimizer.pt      dense state (torch.save; read with weights_only=True)
        dynamicemb/<table>/rank-<r>-of-<n>.{json,bin}   one shard per saving rank
        DONE
      model.ckpt-<step>.tmp/        being written; never resumed from
"""

from __future__ import annotations

import json
import os
import re
import shutil
from typing import Any

from hashrec.checkpoint.shard_file import fsync_dir, read_versioned_json

CHECKPOINT_PREFIX = "model.ckpt-"
TEMP_SUFFIX = ".tmp"
MARKER_NAME = "DONE"
META_NAME = "meta.json"
TABLES_DIR = "dynamicemb"
MODEL_FILE = "model.pt"
OPTIMIZER_FILE = "optimizer.pt"
FORMAT_NAME = "hashrec-checkpoint"
FORMAT_VERSION = 1

_CKPT_RE = re.compile(r"^model\.ckpt-(\d+)$")
# Checkpoints and incremental dumps (dump-<step>, see hashrec.checkpoint.incremental).
_ANY_RE = re.compile(r"^(?:model\.ckpt-|dump-)(\d+)$")


def checkpoint_path(model_dir: str, step: int) -> str:
    """``model_dir/model.ckpt-<step>``."""
    return os.path.join(model_dir, f"{CHECKPOINT_PREFIX}{step}")


def shard_stem(root: str, table: str, rank: int, world_size: int) -> str:
    """Path without extension of ``rank``'s shard of ``table`` under a checkpoint ``root``."""
    return os.path.join(root, TABLES_DIR, table, f"rank-{rank:05d}-of-{world_size:05d}")


def is_complete(path: str) -> bool:
    """Whether ``path`` is a checkpoint directory whose completion marker exists."""
    return os.path.isfile(os.path.join(path, MARKER_NAME))


def complete_checkpoints(model_dir: str) -> list[tuple[int, str]]:
    """Complete checkpoints under ``model_dir`` as (step, path), oldest step first."""
    if not os.path.isdir(model_dir):
        return []
    found = []
    for name in os.listdir(model_dir):
        match = _CKPT_RE.match(name)
        path = os.path.join(model_dir, name)
        if match and is_complete(path):
            found.append((int(match.group(1)), path))
    return sorted(found)


def is_checkpoint_name(name: str) -> bool:
    """Whether ``name`` is ``model.ckpt-<step>`` or ``dump-<step>``, complete or not."""
    return _ANY_RE.match(name) is not None


def complete_children(path: str) -> list[tuple[int, str]]:
    """Complete checkpoints and incremental dumps directly inside ``path`` as (step, path),
    oldest step first."""
    found = []
    for name in os.listdir(path) if os.path.isdir(path) else []:
        match = _ANY_RE.match(name)
        child = os.path.join(path, name)
        if match and is_complete(child):
            found.append((int(match.group(1)), child))
    return sorted(found)


def latest_checkpoint(model_dir: str) -> str | None:
    """Path of the complete checkpoint with the largest step, or None if there is none.

    Directories without the completion marker (interrupted saves) are skipped.
    """
    found = complete_checkpoints(model_dir)
    return found[-1][1] if found else None


def write_marker(path: str, content: dict[str, Any]) -> None:
    """Writes and fsyncs the completion marker of checkpoint ``path``, then the directory."""
    marker = os.path.join(path, MARKER_NAME)
    with open(marker, "w", encoding="utf-8") as f:
        json.dump(content, f)
        f.flush()
        os.fsync(f.fileno())
    fsync_dir(path)


def write_json(path: str, content: dict[str, Any]) -> None:
    """Writes ``content`` as JSON and fsyncs it."""
    with open(path, "w", encoding="utf-8") as f:
        json.dump(content, f, indent=1, sort_keys=True)
        f.flush()
        os.fsync(f.fileno())


def read_meta(path: str) -> dict[str, Any]:
    """Reads and checks ``meta.json`` of a checkpoint or dump directory ``path``."""
    return read_versioned_json(
        os.path.join(path, META_NAME), FORMAT_NAME, FORMAT_VERSION,
        f"; {path} is not a checkpoint (or an interrupted save)")


def prune_checkpoints(model_dir: str, keep_max: int, keep_path: str) -> list[str]:
    """Deletes the oldest complete checkpoints so that at most ``keep_max`` remain.

    ``keep_max <= 0`` keeps everything; ``keep_path`` (the checkpoint just written)
    is never deleted. Returns the deleted paths.
    """
    if keep_max <= 0:
        return []
    found = [p for _, p in complete_checkpoints(model_dir)]
    removable = [p for p in found if os.path.abspath(p) != os.path.abspath(keep_path)]
    excess = len(found) - keep_max
    deleted = []
    for path in removable[:max(excess, 0)]:
        # Drop the marker first: a crash mid-delete leaves an incomplete directory,
        # which is never resumed from, rather than a "complete" one missing files.
        os.remove(os.path.join(path, MARKER_NAME))
        shutil.rmtree(path)
        deleted.append(path)
    return deleted
