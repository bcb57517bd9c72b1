"""Where checkpoint files live and which checkpoints count as complete.

::

    model_dir/
      model.ckpt-<step>/            complete once DONE exists (written last)
        meta.json                   step, world size, tables, dims, format version; sizes
                                    and checksums of the .pt files (shards: their .json)
        model.pt  optimizer.pt      dense state (torch.save; read with weights_only=True)
        optimizer-<i>.pt            the state of the dense optimizers of other kinds, if any
        train_metrics.pt            the trainer's train metrics, summed over the ranks, when
                                    the saver gives them (checkpoints before have none)
        dynamicemb/<table>/rank-<r>-of-<n>.{json,bin}   one shard per saving rank
        rank_state/rank-<r>-of-<n>.pt   each rank's own state, when the saver gives one
                                    (the trainer's random generator states)
        DONE
      model.ckpt-<step>.tmp/        being written; never resumed from
      model.ckpt-<step>.replaced/   the previous copy of a step saved again, kept until
                                    the new copy is complete; it counts as the step's
                                    checkpoint while ``model.ckpt-<step>`` is not complete
"""

from __future__ import annotations

import json
import os
import re
import shutil
from collections.abc import Sequence
from typing import Any

from hashrec.checkpoint.shard_file import fsync_dir, read_versioned_json

CHECKPOINT_PREFIX = "model.ckpt-"
TEMP_SUFFIX = ".tmp"
REPLACED_SUFFIX = ".replaced"
MARKER_NAME = "DONE"
META_NAME = "meta.json"
TABLES_DIR = "dynamicemb"
RANK_STATE_DIR = "rank_state"
RANK_STATE_FILES = "rank_state_files"  # meta.json: each rank's file, bytes and xxh3_64
MODEL_FILE = "model.pt"
OPTIMIZER_FILE = "optimizer.pt"
TRAIN_METRICS_FILE = "train_metrics.pt"
TRAIN_METRICS = "train_metrics"  # meta.json: the file's name, bytes and xxh3_64
FORMAT_NAME = "hashrec-checkpoint"
FORMAT_VERSION = 1

_CKPT_RE = re.compile(r"^model\.ckpt-(\d+)$")
_LEFTOVER_RE = re.compile(r"^model\.ckpt-(\d+)(\.tmp|\.replaced)?$")
# Checkpoints and incremental dumps (dump-<step>, see hashrec.checkpoint.incremental).
_ANY_RE = re.compile(r"^(?:model\.ckpt-|dump-)(\d+)$")


def optimizer_file(index: int) -> str:
    """The file of the dense optimizer ``index`` (0: the dense optimizer's own kind)."""
    return OPTIMIZER_FILE if index == 0 else f"optimizer-{index}.pt"


def checkpoint_path(model_dir: str, step: int) -> str:
    """``model_dir/model.ckpt-<step>``."""
    return os.path.join(model_dir, f"{CHECKPOINT_PREFIX}{step}")


def shard_stem(root: str, table: str, rank: int, world_size: int) -> str:
    """Path without extension of ``rank``'s shard of ``table`` under a checkpoint ``root``."""
    return os.path.join(root, TABLES_DIR, table, f"rank-{rank:05d}-of-{world_size:05d}")


def rank_state_path(root: str, rank: int, world_size: int) -> str:
    """Path of ``rank``'s own state (``save_checkpoint(rank_state=...)``) under ``root``."""
    return os.path.join(root, RANK_STATE_DIR, f"rank-{rank:05d}-of-{world_size:05d}.pt")


def is_complete(path: str) -> bool:
    """Whether ``path`` is a checkpoint directory whose completion marker exists."""
    return os.path.isfile(os.path.join(path, MARKER_NAME))


def complete_checkpoints(model_dir: str) -> list[tuple[int, str]]:
    """Complete checkpoints under ``model_dir`` as (step, path), oldest step first.

    A step whose ``model.ckpt-<step>`` is not complete but whose ``.replaced`` copy
    is (a save of the same step interrupted while swapping the copies) is that copy.
    """
    if not os.path.isdir(model_dir):
        return []
    found: dict[int, str] = {}
    for name in os.listdir(model_dir):
        match = _LEFTOVER_RE.match(name)
        path = os.path.join(model_dir, name)
        if not match or match.group(2) == TEMP_SUFFIX or not is_complete(path):
            continue
        step = int(match.group(1))
        if match.group(2) is None or step not in found:
            found[step] = path
    return sorted(found.items())


def checkpoint_dirs(model_dir: str) -> list[str]:
    """``model.ckpt-<step>`` directories in ``model_dir``, complete or not, oldest first;
    ``.tmp`` saves in progress (or abandoned) and ``.replaced`` copies are not listed."""
    if not os.path.isdir(model_dir):
        return []
    steps = [(int(m.group(1)), name) for name in os.listdir(model_dir)
             if (m := _CKPT_RE.match(name))]
    return [os.path.join(model_dir, name) for _, name in sorted(steps)]


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


def _remove(path: str) -> None:
    # Drop the marker first: a crash mid-delete leaves an incomplete directory,
    # which is never resumed from, rather than a "complete" one missing files.
    marker = os.path.join(path, MARKER_NAME)
    if os.path.isfile(marker):
        os.remove(marker)
    shutil.rmtree(path, ignore_errors=True)


def remove_leftovers(model_dir: str, keep_path: str) -> list[str]:
    """Removes what interrupted saves and prunes left in ``model_dir``; returns the paths.

    Call it only from the process that saves into ``model_dir``, between saves:
    ``.tmp`` directories (abandoned saves), ``model.ckpt-<step>`` directories without
    their marker (a prune or a save interrupted), and ``.replaced`` copies, which are
    renamed back when the step has no other complete copy. ``keep_path`` (the
    checkpoint just written) is never touched.
    """
    removed = []
    keep = os.path.abspath(keep_path)
    for name in sorted(os.listdir(model_dir)) if os.path.isdir(model_dir) else []:
        match = _LEFTOVER_RE.match(name)
        path = os.path.join(model_dir, name)
        if not match or os.path.abspath(path) == keep or not os.path.isdir(path):
            continue
        final = os.path.join(model_dir, CHECKPOINT_PREFIX + match.group(1))
        if match.group(2) == REPLACED_SUFFIX and is_complete(path) and not is_complete(final):
            if os.path.abspath(final) != keep:
                shutil.rmtree(final, ignore_errors=True)
                os.rename(path, final)
                fsync_dir(model_dir)
                continue
        if match.group(2) is not None or not is_complete(path):
            _remove(path)
            removed.append(path)
    return removed


def prune_checkpoints(model_dir: str, keep_max: int, keep_path: str,
                      keep_also: Sequence[str] = ()) -> list[str]:
    """Deletes the oldest complete checkpoints so that at most ``keep_max`` remain, and
    the leftovers of interrupted saves and prunes (see ``remove_leftovers``).

    ``keep_max <= 0`` keeps every complete checkpoint; ``keep_path`` (the checkpoint
    just written) is never deleted, nor ``keep_also`` (the best one, kept beside the
    ``keep_max`` latest). Returns the deleted paths.
    """
    deleted = remove_leftovers(model_dir, keep_path)
    if keep_max <= 0:
        return deleted
    spared = {os.path.abspath(p) for p in keep_also} - {os.path.abspath(keep_path)}
    found = [p for _, p in complete_checkpoints(model_dir) if os.path.abspath(p) not in spared]
    removable = [p for p in found if os.path.abspath(p) != os.path.abspath(keep_path)]
    excess = len(found) - keep_max
    for path in removable[:max(excess, 0)]:
        _remove(path)
        deleted.append(path)
    return deleted
