"""The two top-level runs: train (with evaluation) and evaluate a checkpoint."""

from __future__ import annotations

import logging

from hashrec.checkpoint import read_param_map, restore_checkpoint
from hashrec.data.loader import check_input
from hashrec.data.paths import expand_input_path
from hashrec.distributed.data_parallel import broadcast_state
from hashrec.train import checkpoints
from hashrec.train.errors import TrainError
from hashrec.train.evaluation import EVAL_RESULT_FILE, evaluate, write_eval_result
from hashrec.train.loop import LoopOptions, TrainLoop
from hashrec.train.model_dir_lock import model_dir_lock
from hashrec.train.session import build_session, write_pipeline_config

logger = logging.getLogger("hashrec.train")


def train_and_evaluate(config, continue_train: bool = False,
                       fine_tune_checkpoint: str | None = None,
                       ignore_restore_optimizer: bool = False, rank: int = 0,
                       world_size: int = 1, ctx=None) -> dict | None:
    """Train ``config``'s model, checkpointing and evaluating on the way.

    Args:
        config: the effective EasyRecConfig (edits and path overrides applied).
        continue_train: resume from the latest checkpoint in ``config.model_dir``.
        fine_tune_checkpoint: initialize from this checkpoint (or model_dir) when not
            resuming; defaults to ``train_config.fine_tune_checkpoint``. What of the model
            it holds is restored (under ``train_config.fine_tune_ckpt_param_map``'s names),
            the rest starts fresh.
        ignore_restore_optimizer: resume model and tables but not optimizer state.
        rank, world_size: this process's place in a distributed run.
        ctx: the ``DistContext`` of a torchrun worker (overrides rank and world_size;
            world size > 1 shards the dynamic tables and averages dense gradients).

    Returns:
        The last evaluation result (None without an eval input).

    Raises:
        TrainError: model_dir holds checkpoints and ``continue_train`` is False, another
            training run uses model_dir (``model_dir_lock``), or an invalid training
            setting.
        CheckpointError: an unreadable or malformed ``fine_tune_ckpt_param_map``, or one
            naming what the model or the checkpoint does not hold.
        DataError: an input path names nothing (checked before the model is built).
        TrainInterrupted: SIGINT or SIGTERM stopped training (after a checkpoint).
    """
    checkpoints.check_model_dir(config.model_dir, continue_train)
    chief = (ctx.rank if ctx is not None else rank) == 0
    with model_dir_lock(config.model_dir, held=chief):
        return _train(config, continue_train, fine_tune_checkpoint, ignore_restore_optimizer,
                      rank, world_size, ctx)


def _train(config, continue_train: bool, fine_tune_checkpoint: str | None,
           ignore_restore_optimizer: bool, rank: int, world_size: int, ctx) -> dict | None:
    """``train_and_evaluate`` under the model_dir's lock."""
    model_dir = config.model_dir
    checkpoints.check_model_dir(model_dir, continue_train)  # as it is now, locked
    # A typo in an input path found now, not after building the tables (or, for the
    # eval path, after hours of training).
    expand_input_path(config.train_input_path)
    if config.eval_input_path:
        expand_input_path(config.eval_input_path)
    map_path = config.train_config.fine_tune_ckpt_param_map
    param_map = read_param_map(map_path) if map_path else None  # a bad file found now
    session = build_session(config, rank, world_size, ctx=ctx)
    if config.eval_input_path:  # its format and columns now, not after the first save
        check_input(config.data_config, session.feature_set, config.eval_input_path, "eval",
                    session.negative_items())
    resume = checkpoints.restore_for_training(
        model_dir, session.model, session.dense, continue_train,
        fine_tune_checkpoint or config.train_config.fine_tune_checkpoint or None,
        restore_optimizer=not ignore_restore_optimizer, param_map=param_map)
    if resume.path is None and session.is_chief:
        checkpoints.note_unread_init_tables(session.feature_set)
        checkpoints.note_empty_frozen_tables(session.feature_set)
    # Only a config its checkpoints fit replaces the model_dir's copy.
    write_pipeline_config(config, model_dir, session.rank)
    # Replicas start equal: dense network, dense tables and their optimizer rows.
    broadcast_state(session.model, session.ctx)
    options = LoopOptions.from_config(config)
    if session.is_chief:
        logger.info("training on %s from step %d (model_dir %s)", session.device, resume.step,
                    model_dir)
    result = TrainLoop(session, options, resume).run(config.train_input_path)
    return result


def evaluate_checkpoint(config, checkpoint_path: str | None = None, rank: int = 0,
                        world_size: int = 1, ctx=None,
                        result_filename: str = EVAL_RESULT_FILE) -> dict:
    """Evaluate a checkpoint on ``config.eval_input_path`` and record the result.

    Args:
        config: the effective EasyRecConfig.
        checkpoint_path: a ``model.ckpt-<step>`` directory or a model_dir; default
            the latest complete checkpoint of ``config.model_dir`` (a model_dir's latest
            as rank 0 finds it, on every rank).
        rank, world_size, ctx: as in :func:`train_and_evaluate`.
        result_filename: the file under ``config.model_dir`` the result is appended to
            (eval_result.txt, which the best exporter and ``--continue_train`` read, by
            default).

    Returns:
        The result also appended to ``<model_dir>/<result_filename>`` (with the
        checkpoint's path).

    Raises:
        TrainError: ``config.eval_input_path`` is empty.
    """
    if not config.eval_input_path:
        raise TrainError("no eval input: set eval_input_path in the config or pass "
                         "--eval_input_path")
    source = checkpoint_path or config.model_dir
    checkpoints.agreed_checkpoint(source)  # nothing there: say so before building
    expand_input_path(config.eval_input_path)
    session = build_session(config, rank, world_size, ctx=ctx, purpose="evaluation")
    path, meta = checkpoints.restore_resolved(
        source, lambda path: restore_checkpoint(path, session.model, None,
                                                session.model.embedding.dynamic_tables(),
                                                restore_optimizer=False, keep_every_row=True))
    logger.info("evaluating %s", path)
    result = evaluate(session, config.eval_input_path, int(meta["step"]),
                      config.eval_config.num_steps)
    write_eval_result(config.model_dir, result, session.rank, path, result_filename)
    return result
