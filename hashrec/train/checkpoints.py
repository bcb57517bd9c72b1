"""When and what the trainer saves and restores (the format is hashrec.checkpoint's).

A run writes ``model_dir/model.ckpt-<step>/`` every ``save_checkpoints_steps``
steps and/or every ``save_checkpoints_epochs`` epochs, and once at the end.
Checkpoint ``extra`` carries the epoch count, so a resumed run continues the
epoch loop where it stopped (data of a partly finished epoch is read again
from its start).
"""

from __future__ import annotations

import glob
import logging
import os
from dataclasses import dataclass

from hashrec.checkpoint import latest_checkpoint, restore_checkpoint, save_checkpoint
from hashrec.train.errors import TrainError

logger = logging.getLogger("hashrec.train")

CHECKPOINT_GLOB = "model.ckpt-*"


@dataclass(frozen=True)
class Resume:
    """Where training starts: ``step`` and ``epoch`` already done, restored from ``path``."""

    step: int = 0
    epoch: int = 0
    path: str | None = None


def existing_checkpoints(model_dir: str) -> list[str]:
    """Every ``model.ckpt-*`` entry in ``model_dir`` (complete or not)."""
    return sorted(glob.glob(os.path.join(model_dir, CHECKPOINT_GLOB)))


def check_model_dir(model_dir: str, continue_train: bool) -> None:
    """Refuse to train over an existing run unless asked to continue it.

    Raises:
        TrainError: ``model_dir`` is a file, or it holds checkpoints and
            ``continue_train`` is False.
    """
    if os.path.exists(model_dir) and not os.path.isdir(model_dir):
        raise TrainError(f"model_dir {model_dir!r} is a file; --model_dir (or model_dir in the "
                         f"config) must name a directory")
    found = existing_checkpoints(model_dir)
    if found and not continue_train:
        raise TrainError(
            f"model_dir {model_dir!r} already holds checkpoints ({os.path.basename(found[-1])}"
            f"{' and more' if len(found) > 1 else ''}); pass --continue_train to resume it, "
            f"or choose an empty --model_dir")


def restore_for_training(model_dir: str, model, dense_optimizer, continue_train: bool,
                         fine_tune_checkpoint: str | None,
                         restore_optimizer: bool = True) -> Resume:
    """Restore the latest checkpoint of ``model_dir`` (continue) or a fine-tune start.

    With ``continue_train`` and a complete checkpoint in ``model_dir`` training
    resumes from it (optimizer state too unless ``restore_optimizer`` is False).
    Otherwise ``fine_tune_checkpoint`` (a checkpoint directory, or a model_dir
    whose latest checkpoint is taken) initializes the model and tables only and
    training starts at step 0.
    """
    tables = model.embedding.dynamic_tables()
    if continue_train:
        path = latest_checkpoint(model_dir)
        if path is not None:
            meta = restore_checkpoint(path, model, dense_optimizer.optimizer, tables,
                                      restore_optimizer=restore_optimizer)
            extra = meta.get("extra") or {}
            logger.info("continuing from %s (step %d)", path, int(meta["step"]))
            return Resume(int(meta["step"]), int(extra.get("epoch", 0)), path)
        if existing_checkpoints(model_dir):
            logger.warning("model_dir %s holds no complete checkpoint; starting fresh",
                           model_dir)
    if fine_tune_checkpoint:
        path = resolve_checkpoint(fine_tune_checkpoint)
        restore_checkpoint(path, model, None, tables, restore_optimizer=False)
        logger.info("initialized from fine_tune_checkpoint %s", path)
        return Resume(0, 0, path)
    return Resume()


def resolve_checkpoint(path: str) -> str:
    """A checkpoint directory itself, or the latest complete one inside a model_dir.

    Raises:
        TrainError: nothing restorable at ``path``.
    """
    if not os.path.isdir(path):
        raise TrainError(f"checkpoint path {path!r} does not exist")
    if os.path.basename(os.path.normpath(path)).startswith("model.ckpt-"):
        return path
    latest = latest_checkpoint(path)
    if latest is None:
        raise TrainError(f"{path!r} holds no complete checkpoint (model.ckpt-<step>/)")
    return latest


def save(model_dir: str, step: int, epoch: int, model, dense_optimizer,
         keep_checkpoint_max: int) -> str:
    """Write ``model.ckpt-<step>`` (dense state, optimizer, dynamic tables)."""
    path = save_checkpoint(model_dir, step, model, dense_optimizer.optimizer,
                           model.embedding.dynamic_tables(), keep_checkpoint_max,
                           extra={"epoch": epoch})
    logger.info("saved checkpoint %s", path)
    return path
