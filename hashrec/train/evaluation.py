"""Evaluation: stream an input through the model, reduce metrics, record the result.

The model runs in eval mode (dynamic tables read-only: unseen ids read as the
eval initializer) under ``torch.no_grad``. Metrics keep fixed-size state (see
``hashrec.train.metrics``), so evaluation memory does not grow with the input.
Each evaluation appends one JSON object, at least ``{"step", "auc"}`` (a multi-task
model's ``auc_<tower_name>``; a model of more than two classes reports ``multiclass_auc``
instead unless its metrics say otherwise), the step again as ``global_step``
(TorchEasyRec's key) and the checkpoint's path, to ``<model_dir>/eval_result.txt`` (rank 0;
``hashrec.eval --eval_result_filename`` names another file), and logs, per dynamic or ZCH
table, the share of the evaluated ids (unique ids a batch) that had a row: the others,
unseen in training, evicted or not yet admitted, read the eval initializer. Under several
ranks each rank
evaluates its share of the input (every rank must list the same files, or the evaluation
fails with a ``DataError`` before its first batch); a rank that runs out first keeps serving its
peers' embedding lookups until all are done, and the metrics are summed over ranks.
An evaluation inside training stops at its next batch when a stop signal arrives (on any
rank: every rank stops at the same batch) and gives no result.
"""

from __future__ import annotations

import json
import logging
import math
import os
import time

import torch

from hashrec.checkpoint.dist_util import run_on_all_ranks
from hashrec.checkpoint.errors import disk_full_hint
from hashrec.checkpoint.layout import complete_checkpoints
from hashrec.distributed import all_reduce_scalars, single_process_context
from hashrec.models.losses import BINARY_LOSSES
from hashrec.train.distributed import check_same_input, eval_batches
from hashrec.train.errors import TrainError
from hashrec.train.grouped_auc import GroupedAUC
from hashrec.train.interrupt import StopSignals
from hashrec.train.metrics import (
    Accuracy,
    BinnedAUC,
    MeanLoss,
    RecallAtK,
    SoftLabels,
    build_metrics,
    grouping_ids,
)
from hashrec.train.progress import duration
from hashrec.train.xauc import XAUC, GroupedXAUC

logger = logging.getLogger("hashrec.train")

EVAL_RESULT_FILE = "eval_result.txt"


def evaluate(session, input_path: str, step: int, max_steps: int = 0,
             signals: StopSignals | None = None) -> dict | None:
    """Metrics of ``session.model`` on ``input_path``.

    Args:
        session: a ``hashrec.train.session.Session``.
        input_path: comma-separated files, directories or globs.
        step: the global step being evaluated (recorded in the result).
        max_steps: evaluate at most this many batches (0 = the whole input).
        signals: the training run's stop signals: a signal received (by any rank) stops
            the evaluation before its next batch, and ``signals.agreed`` is set.

    Logs the batches done (of this rank's, with the time left at the rate so far) every
    ``eval_config.log_step_count_steps`` (rank 0).

    Returns:
        ``{"step": step, "<metric>": value, ..., "loss": mean loss, "<loss name>": its
        mean, ..., "num_examples": n}``; a multi-task model's metrics are
        ``<metric>_<tower_name>``, its loss names ``<loss>_<tower_name>`` (each task loss
        times the task's weight), and ``loss`` their sum. None when a signal cut it
        short.
    """
    # Evaluating draws from torch's random generators (the eval loader's seed, say), which
    # new rows' initial values in training also draw from: their states are put back after,
    # so that an evaluation leaves the training run as it was.
    devices = [session.device] if session.device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):
        return _evaluate(session, input_path, step, max_steps, signals)


def _evaluate(session, input_path: str, step: int, max_steps: int,
              signals: StopSignals | None) -> dict | None:
    model = session.model
    log_every = session.config.eval_config.log_step_count_steps if session.is_chief else 0
    # (task, metric) per result key: <metric>, or <metric>_<tower_name> of a multi-task
    # model's task.
    metrics = {name + task.suffix: (task, metric) for task in model.tasks
               for name, metric in build_metrics(task.metric_configs, session.device,
                                                 task.regression, task.num_class,
                                                 bool(task.match)).items()}
    soft_labels = _soft_label_counters(metrics, session.device)
    mean_loss = MeanLoss(session.device, len(model.eval_losses))
    was_training = model.training
    model.eval()
    start, batches = time.perf_counter(), 0
    ids_before = _table_ids(model.embedding)
    try:
        with torch.no_grad():
            ctx = session.ctx or single_process_context(session.device)
            loader = session.loader(input_path, "eval")
            if ctx.is_distributed:
                check_same_input(loader.dataset, input_path, ctx, "eval")
            total = own_batches(loader, session.rank, max_steps) if log_every else 0
            for batch in eval_batches(loader, ctx, model.embedding.idle_lookups, max_steps,
                                      signals):
                batch = batch.to(session.device)
                with session.precision.autocast():
                    predictions = model(batch)
                update_metrics(metrics.values(), predictions, batch)
                for task, (counter, _) in soft_labels.items():
                    counter.update(task_labels(task, predictions, batch))
                # Each loss term (a task's) is averaged over the rows with its weights.
                targets = model.targets(batch)  # labels, then row weights if any, ...
                losses = torch.stack(list(model.loss(predictions, batch, targets).values()))
                weights = model.target_weights(targets)
                mean_loss.add(losses, batch.batch_size,
                              weights.sum(dim=0) if weights is not None else None)
                batches += 1
                if log_every and batches % log_every == 0:
                    _log_progress(step, batches, total, time.perf_counter() - start)
    finally:
        model.train(was_training)
    if signals is not None and signals.agreed is not None:
        if session.is_chief:
            logger.warning("eval at step %d cut short by %s after %d batches (%.1fs); no "
                           "result is written for a partial evaluation", step, signals.name,
                           batches, time.perf_counter() - start)
        return None
    result = _result(step, metrics, mean_loss, soft_labels, session.is_chief)
    # Each loss term under its name too (binary_cross_entropy, l2_loss_<tower_name>, ...),
    # as TorchEasyRec reports them; "loss" is their sum.
    result.update(zip(model.eval_losses, mean_loss.terms()))
    result["num_examples"] = mean_loss.examples
    logger.info("eval at step %d on %d examples (%.1fs): %s", step, result["num_examples"],
                time.perf_counter() - start,
                ", ".join(f"{k} {v:.5f}" for k, v in result.items()
                          if k not in ("step", "num_examples")))
    _log_ids_found(session, step, ids_before)
    return result


def _soft_label_counters(metrics: dict, device) -> dict:
    """Task -> (a SoftLabels counter, the result keys of its metrics that read the label as
    a class) for each task of a binary loss (whose labels may be soft) with such metrics."""
    counters: dict = {}
    for name, (task, metric) in metrics.items():
        if task.loss.name in BINARY_LOSSES and isinstance(metric, (BinnedAUC, GroupedAUC,
                                                                   Accuracy)):
            counters.setdefault(task, (SoftLabels(device), []))[1].append(name)
    return counters


def _result(step: int, metrics: dict, mean_loss: MeanLoss, soft_labels: dict,
            chief: bool) -> dict:
    """The metrics' values, synced over the ranks, then the loss; warnings (rank 0) for
    soft labels the metrics thresholded and for metrics that are undefined (NaN)."""
    result: dict = {"step": int(step)}
    for name, metric in [*((k, m) for k, (_, m) in metrics.items()), ("loss", mean_loss)]:
        metric.sync()
        result[name] = metric.compute()
        why = metric.undefined_reason() if math.isnan(result[name]) and \
            hasattr(metric, "undefined_reason") else ""
        if why and chief:
            logger.warning("eval at step %d: %s is undefined (NaN): %s", step, name, why)
    for task, (counter, names) in soft_labels.items():
        counter.sync()
        if chief:
            counter.warn(task.label_name, names)
    return result


def own_batches(loader, rank: int, max_steps: int = 0) -> int:
    """The batches this rank evaluates: its share of the input, at most ``max_steps``."""
    total = sum(loader.dataset.reader_batches(rank, loader.num_workers))
    return min(total, max_steps) if max_steps else total


def _log_progress(step: int, batches: int, total: int, seconds: float) -> None:
    """``eval at step S: B of N batches (T s, about L left)``, the time left at the
    rate so far (rank 0's batches: its share of the input), as the training line says it."""
    if batches >= total:
        logger.info("eval at step %d: %d of %d batches (%.1fs)", step, batches, total,
                    seconds)
        return
    logger.info("eval at step %d: %d of %d batches (%.1fs, about %s left)", step, batches,
                total, seconds, duration(seconds / batches * (total - batches)))


def _table_ids(embedding) -> dict[str, float]:
    """Per dynamic or ZCH table, the unique ids its lookups read so far (``ids/<table>``)
    and those of them that had a row (``found/<table>``)."""
    dynamic = set(embedding.dynamic_tables())
    out = {}
    for name, stats in embedding.stats()["tables"].items():
        if stats["storage"] in dynamic or name in embedding.zch_remappers:
            out[f"ids/{name}"] = float(stats["unique_ids"])
            out[f"found/{name}"] = float(stats["stored"])
    return out


def _log_ids_found(session, step: int, before: dict[str, float]) -> None:
    """Logs (rank 0) the share of each table's evaluated ids that had a row; the others
    read the eval initializer (ids unseen in training, evicted, or not yet admitted).
    Under several ranks a collective every rank calls."""
    after = _table_ids(session.model.embedding)
    counts = {key: after[key] - before.get(key, 0.0) for key in after}
    if session.ctx is not None and session.ctx.is_distributed:
        counts = all_reduce_scalars(counts, session.ctx)
    tables = [key[len("ids/"):] for key in counts if key.startswith("ids/")]
    shares = [f"{t} {counts['found/' + t] / counts['ids/' + t]:.1%}" for t in tables
              if counts["ids/" + t]]
    if shares and session.is_chief:
        logger.info("eval at step %d: evaluated ids found in the tables (unique ids a batch; "
                    "the others read the eval initializer): %s", step, ", ".join(shares))


def task_labels(task, predictions: dict, batch) -> torch.Tensor:
    """The labels ``task``'s metrics read: the batch's label column, or a model whose
    predictions are a row's candidates' (dlrm_hstu: ``candidate_mask``) each candidate's
    ``candidate_label_<task>``."""
    mask = predictions.get("candidate_mask")
    if mask is None:
        return batch.labels[task.label_name]
    return predictions["candidate_label" + task.suffix][mask]


def update_metrics(metrics, predictions: dict, batch) -> None:
    """Adds a batch to each (task, metric): the task's prediction against its label (the
    AUCs and XAUCs of one probability a row read a two-class task's ``probs1``). Where
    the predictions are a row's candidates' (``candidate_mask``, dlrm_hstu's), each
    candidate counts, its row's grouping id its own; a row's padding does not."""
    mask = predictions.get("candidate_mask")
    pick = (lambda t: t) if mask is None else (lambda t: t[mask])  # noqa: E731
    for task, metric in metrics:
        if isinstance(metric, RecallAtK):  # reads no label; hstu_match's mask of queries
            metric.update(predictions[task.prediction], task.match,
                          predictions.get("query_mask"))
            continue
        labels = task_labels(task, predictions, batch)
        if isinstance(metric, (GroupedAUC, GroupedXAUC)):
            groups = grouping_ids(batch, metric)
            if mask is not None:
                groups = groups[:batch.batch_size].repeat_interleave(
                    mask.numel() // batch.batch_size)
            metric.update(pick(predictions[task.positive_probs]), labels, pick(groups))
        elif isinstance(metric, (BinnedAUC, XAUC)):
            metric.update(pick(predictions[task.positive_probs]), labels)
        else:
            metric.update(pick(predictions[task.prediction]), labels)


def write_eval_result(model_dir: str, result: dict, rank: int = 0,
                      checkpoint: str | None = None, filename: str = EVAL_RESULT_FILE) -> None:
    """Append ``result`` as one JSON line to ``<model_dir>/<filename>`` (rank 0; default
    eval_result.txt), with the path of the ``checkpoint`` evaluated when given.

    Call it on every rank (a collective under torch.distributed), so that a failed
    write stops every rank, not rank 0 alone.

    Raises:
        TrainError: the file cannot be written; the message names it (the result itself
            is in the log line of the evaluation).
    """
    run_on_all_ranks(lambda: _append_result(model_dir, result, checkpoint, filename)
                     if rank == 0 else None, f"writing {filename} in {model_dir}", TrainError)


def _append_result(model_dir: str, result: dict, checkpoint: str | None,
                   filename: str) -> None:
    path = os.path.join(model_dir, filename)
    if "step" in result:
        # TorchEasyRec's name of the step, for what reads its result files.
        result = {**result, "global_step": result["step"]}
    if checkpoint is not None:
        result = {**result, "checkpoint": os.path.abspath(checkpoint)}
    # JSON has no NaN (an AUC of a single class is undefined): null instead.
    result = {k: None if isinstance(v, float) and not math.isfinite(v) else v
              for k, v in result.items()}
    try:
        os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
        with open(path, "a+b") as f:
            cut = False
            if f.seek(0, os.SEEK_END) > 0:
                f.seek(-1, os.SEEK_END)
                cut = f.read(1) != b"\n"
            # A line a crash cut short stays a line of its own, not the start of this one.
            f.write((("\n" if cut else "") + json.dumps(result, sort_keys=True) + "\n")
                    .encode())
    except OSError as err:
        raise TrainError(f"cannot append the evaluation result of step {result.get('step')} "
                         f"to {path}: {err.strerror or err}"
                         f"{disk_full_hint(err, None, 'run again')}; the result is in the log "
                         f"line above") from None


def evaluated(model_dir: str, checkpoint: str) -> bool:
    """Whether ``<model_dir>/eval_result.txt`` holds a result of ``checkpoint`` (a line
    naming a checkpoint of its name; a line cut short, as a crash may leave, is none)."""
    name = os.path.basename(os.path.normpath(checkpoint))
    for record in _results(model_dir):
        recorded = record.get("checkpoint")
        if isinstance(recorded, str) and os.path.basename(os.path.normpath(recorded)) == name:
            return True
    return False


def _results(model_dir: str) -> list[dict]:
    """The readable JSON objects of ``<model_dir>/eval_result.txt`` (none without the file;
    a line a crash cut short is skipped)."""
    try:
        with open(os.path.join(model_dir, EVAL_RESULT_FILE), encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return []
    results = []
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            results.append(record)
    return results


def best_checkpoint(model_dir: str, metric: str, larger_is_better: bool = True) -> str | None:
    """The complete checkpoint of ``model_dir`` whose evaluation in
    ``<model_dir>/eval_result.txt`` scored best on ``metric`` (export_config's
    ``exporter_type: "best"``): the latest step among equal scores, a checkpoint's last
    result where it was evaluated twice. None where no result names a checkpoint still
    there.

    Raises:
        TrainError: results name checkpoints still there, but none holds a finite
            ``metric`` (the message lists the metrics they hold).
    """
    steps = {os.path.basename(path): (step, path) for step, path in complete_checkpoints(model_dir)}
    scores: dict[str, float] = {}
    held: set[str] = set()
    for record in _results(model_dir):
        checkpoint = record.get("checkpoint")
        name = os.path.basename(os.path.normpath(checkpoint)) if isinstance(checkpoint, str) \
            else None
        if name not in steps:
            continue
        held |= {k for k, v in record.items() if isinstance(v, (int, float))
                 and k not in ("step", "global_step")}
        value = record.get(metric)
        if isinstance(value, (int, float)) and not isinstance(value, bool) \
                and math.isfinite(value):
            scores[name] = float(value) if larger_is_better else -float(value)
    if not scores:
        if not held:
            return None
        raise TrainError(
            f"export_config.best_exporter_metric {metric!r}: no result in "
            f"{os.path.join(model_dir, EVAL_RESULT_FILE)} holds it (they hold "
            f"{', '.join(sorted(held))}); name one of those, or export with "
            f"--checkpoint_path")
    name = max(scores, key=lambda n: (scores[n], steps[n][0]))
    return steps[name][1]
