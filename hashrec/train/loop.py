"""The training loop: steps, epochs, checkpoints, evaluation and progress.

One step: set both learning rates from the schedules, forward (dense network
under autocast, embeddings in float32), backward (the embedding collection
applies the fused sparse update for the batch's rows here), clip dense
gradients, dense optimizer step (every dense optimizer's, one per kind). With
``model_config.use_pareto_loss_weight`` the backward takes the losses weighted by their
Pareto-efficient weights, solved first from each loss's own backward pass through the
dense network (``hashrec.train.pareto``), instead of their sum.

Under torchrun every rank runs the same steps (``EpochStream``: each epoch the
number of batches the rank with the fewest has, known from the row count): dense
gradients are averaged over ranks after backward, before clipping; sparse
updates are exchanged inside backward by the embedding collection; with sample
weights each rank's loss is first scaled so that the ranks' average is the global
batch's weighted mean (``WeightedLossScale``). The progress
line then shows global loss, samples/s and table counters, plus the time the
embedding exchanges took per step (``a2a ... ms/step``).

Batches reach the device through ``DevicePrefetcher``: on CUDA the next
batch's copy runs on a side stream while the current step trains. Each step
first starts the next batch's id deduplication (``EmbeddingCollection.prepare``)
so that its sizes reach the host without draining the stream: the host never
waits for the previous step's kernels and runs ahead of the device.

Step timing (``hashrec.train.timing``, off by default; ``HASHREC_STEP_TIMING=1``)
adds per-phase milliseconds per step to the progress line, keeps the summary
after warm-up in ``TrainLoop.step_timing`` and writes it to
``<model_dir>/step_timing.json`` (under several ranks with every rank's summary in
``ranks``).

Incremental dumps (``train_config.incremental_dump_steps``): every N steps the
dynamic tables' changed rows and evicted keys since the previous dump go to
``<model_dir>/incremental/dump-<step, 12 digits>``
(``hashrec.checkpoint.IncrementalDumper``; the first dump of a run is full).

Python's cyclic garbage collector runs on a step schedule while training
(``hashrec.train.collection_schedule``): a full collection at an arbitrary step
stalls one rank and, under torchrun, every rank waiting for it.

Checkpoints (every ``save_checkpoints_steps`` or ``save_checkpoints_epochs``, and one at
the end) are saved and, with an eval input, evaluated as
``hashrec.train.checkpoint_schedule`` says; a resumed run first evaluates its checkpoint
when an evaluation due for it left no result (a stop or crash in it).

Stopping: ``num_steps`` (total steps, including those of a resumed run) when
set, else ``num_epochs`` (default 1) passes over the training input. With both
set, whichever comes first; the log says which ended the run. SIGINT and SIGTERM
end it after the current step with a checkpoint, every rank after the same step
(``hashrec.train.stopping``).
A resumed run continues in the epoch it stopped in, past the batches it trained
(``hashrec.train.checkpoints``; only approximately where the number of ranks, loader
workers or the batch size changed: ``resumed_batches``); its incremental dumps after
the restored step, which belong to the interrupted run, are moved aside and the next
dump is full. A run that starts at step 0 moves every dump it finds aside (a run killed
before its first checkpoint leaves dumps but nothing to continue).
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from hashrec.checkpoint import IncrementalDumper, discard_dumps_after
from hashrec.checkpoint.tags import model_tag_tables
from hashrec.distributed import all_reduce_scalars, single_process_context
from hashrec.distributed.data_parallel import FlatGradients
from hashrec.distributed.metrics import all_reduce_sum
from hashrec.distributed.process_group import all_gather_objects
from hashrec.train import checkpoints
from hashrec.train.batch_shares import empty_shares, resumed_batches
from hashrec.train.checkpoint_schedule import CheckpointSchedule
from hashrec.train.collection_schedule import CollectionSchedule
from hashrec.train.distributed import (
    WeightedLossScale,
    check_same_input,
    global_table_counters,
    min_over_ranks,
)
from hashrec.train.errors import TrainError
from hashrec.train.graphs import DenseGraphs
from hashrec.train.optimizers import clip_gradients
from hashrec.train.pareto import ParetoLossWeights
from hashrec.train.placement import gil_switch_interval
from hashrec.train.precision import as_one_optimizer
from hashrec.train.prefetch import DevicePrefetcher, EpochStream
from hashrec.train.progress import ProgressLog, table_counters, total_steps, zch_counters
from hashrec.train.stopping import StopAgreement
from hashrec.train.summaries import Summaries
from hashrec.train.timing import StepTimer, format_phases
from hashrec.train.train_metrics import TrainMetrics

logger = logging.getLogger("hashrec.train")
INCREMENTAL_DIR = "incremental"
PREPARE_AHEAD_ENV = "HASHREC_PREPARE_AHEAD"


@dataclass(frozen=True)
class LoopOptions:
    """What the loop needs from ``train_config`` / ``eval_config`` and the command line."""

    num_steps: int = 0
    num_epochs: int = 0
    save_checkpoints_steps: int = 0
    save_checkpoints_epochs: int = 0
    keep_checkpoint_max: int = 0
    log_step_count_steps: int = 100
    use_tensorboard: bool = False
    eval_input_path: str = ""
    eval_num_steps: int = 0
    incremental_dump_steps: int = 0
    keep_best: checkpoints.BestBy | None = None  # export_config's exporter_type "best"

    @classmethod
    def from_config(cls, config) -> LoopOptions:
        t, e = config.train_config, config.eval_config
        # As in TorchEasyRec, save_checkpoints_epochs replaces save_checkpoints_steps
        steps = 0 if t.save_checkpoints_epochs else t.save_checkpoints_steps
        return cls(t.num_steps, t.num_epochs, steps, t.save_checkpoints_epochs,
                   t.keep_checkpoint_max, t.log_step_count_steps, t.use_tensorboard,
                   config.eval_input_path, e.num_steps, t.incremental_dump_steps,
                   checkpoints.BestBy.from_config(config))

    @property
    def max_epochs(self) -> int | None:
        if self.num_epochs:
            return self.num_epochs
        return None if self.num_steps else 1


def prepare_ahead_from_env() -> int:
    """Batches ahead whose id deduplication a training step starts: 1 (the next batch,
    at the step's start) or 2 (the one after it, at the step's end: its sizes, which
    several ranks share on the device, then have a whole step more to reach the host
    before its forward reads them); ``HASHREC_PREPARE_AHEAD``, default 1."""
    value = os.environ.get(PREPARE_AHEAD_ENV, "1").strip() or "1"
    if value not in ("1", "2"):
        raise TrainError(f"{PREPARE_AHEAD_ENV}={value!r}: expected 1 or 2")
    return int(value)


class TrainLoop:
    """Runs training for a ``Session`` from a ``checkpoints.Resume`` point."""

    def __init__(self, session, options: LoopOptions, resume: checkpoints.Resume) -> None:
        self.session = session
        self.options = options
        self.step = resume.step
        self.epoch = resume.epoch
        data = session.config.data_config
        self.readers = (session.world_size, int(data.num_workers), int(data.batch_size))
        # Batches (per rank) trained of the epoch in progress; a resumed run's first
        # epoch skips those its checkpoint had trained, counted in this run's batches.
        self.epoch_step = self._skip = resumed_batches(resume, self.readers)
        if session.is_chief:
            self._note_layout(resume)
        # A resumed run's random generator states, put back before its first step.
        self._random_state = resume.random_state
        # Training input per epoch, the next epoch's loader started ahead (run_epoch).
        self._inputs: EpochStream | None = None
        self._inputs_path: str | None = None
        # The training input's ``empty_shares`` arguments, for an epoch without a step.
        self._shares: tuple | None = None
        self._lrs: dict[str, float] = {}  # the last step's learning rates, for its line
        self.ctx = session.ctx or single_process_context(session.device)
        self.stop = StopAgreement(self.ctx)
        self.progress = ProgressLog(options.log_step_count_steps, session.rank,
                                    reduce=lambda values: all_reduce_scalars(values, self.ctx))
        self.summaries = Summaries(session.model_dir,
                                   options.use_tensorboard and session.is_chief)
        config = session.config.train_config
        self.grad_clipping = config.grad_clipping if config.HasField("grad_clipping") else None
        self.timer = StepTimer.from_env(session.device, session.world_size)
        self.step_timing: dict = {}
        self.embedding_hook = self._timed_hook(session.precision.embedding_hook())
        self.parameters = session.dense.parameters()
        # The dense optimizers (one per kind) unscaled, and stepped or skipped, together.
        self.dense_optimizer = as_one_optimizer(session.dense.optimizers)
        self.prepare_ahead = prepare_ahead_from_env()
        if self.ctx.is_distributed:  # preparing is a collective: every rank alike
            lowest = min_over_ranks(self.prepare_ahead, self.ctx)
            highest = -min_over_ranks(-self.prepare_ahead, self.ctx)
            if lowest != highest:
                raise TrainError(f"{PREPARE_AHEAD_ENV} differs between ranks ({lowest} to "
                                 f"{highest}); set it alike on every rank")
        # Several ranks with row weights: each loss scaled to its global weighted mean.
        self.weighted_loss = WeightedLossScale(self.ctx) \
            if scales_to_global_mean(session.model, self.ctx) else None
        # Several ranks: the dense gradients live in one buffer that one all-reduce averages.
        self.gradients = FlatGradients(self.parameters, self.ctx) \
            if self.ctx.is_distributed else None
        if self.gradients is not None:  # averaged in the sparse gradient exchange, if any
            session.model.embedding.carry_network_gradients(self.gradients)
        # model_config.use_pareto_loss_weight: the losses weighted by their Pareto weights.
        self.loss_weights = self._pareto(session)
        self.dense_graphs = DenseGraphs(session.model, session.precision.autocast,
                                        config.dense_cuda_graph,
                                        replayable=self.loss_weights is not None)
        # Metrics of the training batches, their windows summed over ranks when folded.
        self.train_metrics = TrainMetrics(
            session.model.tasks, session.device,
            (lambda t: all_reduce_sum(t, self.ctx)) if self.ctx.is_distributed else None)
        if resume.continued:  # a resumed run continues them (checkpoints carry them)
            self.train_metrics.load_state_dict(resume.train_metrics, session.rank, resume.path)
        self.checkpointing = CheckpointSchedule(session, options, resume, self.readers,
                                                self.train_metrics, self.summaries, self.stop)
        # Python's garbage collection at fixed steps while training (same on every rank).
        self.collections = CollectionSchedule()
        self.dumper = self._dumper(resume) if options.incremental_dump_steps else None

    def _pareto(self, session) -> ParetoLossWeights | None:
        """The Pareto loss weights of a model that has them (``pareto_min_weights``), their
        gradients those of the losses the backward takes (scaled under FP16)."""
        least = getattr(session.model, "pareto_min_weights", None)
        if least is None:
            return None
        scaler = session.precision.scaler
        if session.is_chief:
            logger.info("Pareto loss weights of %s, solved every step from their gradients "
                        "on the dense parameters (least weights %s)",
                        ", ".join(session.model.losses), ", ".join(f"{w:g}" for w in least))
        return ParetoLossWeights(session.model.losses, least, self.parameters,
                                 scaler.scale if scaler is not None else None)

    def _note_layout(self, resume: checkpoints.Resume) -> None:
        """Warn when a partly trained epoch is resumed with its batches laid out anew."""
        if not resume.epoch_step or resume.readers is None \
                or tuple(resume.readers) == self.readers:
            return
        world, _, batch = resume.readers
        logger.warning(
            "the training input is read by another layout than when %s was saved (ranks, "
            "loader workers, batch size: %s, were %s): the resumption is only approximate. "
            "Epoch %d had trained %d batches per rank (%d rows); each rank skips the first "
            "%d batches of its share now (%d rows), and those are other rows than the ones "
            "trained: some rows of the epoch are trained twice, others not at all",
            resume.path, self.readers, tuple(resume.readers), self.epoch, resume.epoch_step,
            resume.epoch_step * world * batch, self._skip,
            self._skip * self.readers[0] * self.readers[2])

    def _dumper(self, resume: checkpoints.Resume) -> IncrementalDumper:
        """The incremental dumper, once the dumps of an earlier run that this one does not
        continue are moved aside: those after the restored step, or, starting fresh (no
        checkpoint, or a fine-tune start), every one (a run killed before its first
        checkpoint leaves dumps and nothing to resume)."""
        session = self.session
        dumps = os.path.join(session.model_dir, INCREMENTAL_DIR)
        if session.is_chief:
            moved = discard_dumps_after(dumps, resume.step)
            if moved and resume.path is not None and resume.step:
                logger.warning("incremental dumps after step %d belong to the run that was "
                               "interrupted; moved to %s (the next dump is full)",
                               resume.step, moved)
            elif moved:
                logger.warning("incremental dumps in %s belong to an earlier run that this "
                               "one, starting at step 0, does not continue; moved to %s (the "
                               "next dump is full)", dumps, moved)
        return IncrementalDumper(dumps, session.model.embedding.dynamic_tables(),
                                 self.options.incremental_dump_steps,
                                 tag_tables=model_tag_tables(session.model))

    def done(self) -> bool:
        o = self.options
        if o.num_steps and self.step >= o.num_steps:
            return True
        return o.max_epochs is not None and self.epoch >= o.max_epochs

    def run(self, train_input_path: str) -> dict | None:
        """Train to the end, checkpoint and evaluate; returns the last eval result.

        Raises:
            TrainInterrupted: SIGINT or SIGTERM stopped the run (after a checkpoint).
        """
        self.session.model.train()
        result = None
        unevaluated = self.checkpointing.unevaluated_resume(self.step, self.epoch,
                                                            self.epoch_step, self.done())
        if self.done() and not unevaluated:
            self._log_end("nothing to train: ")
            return None
        try:
            with self.collections, gil_switch_interval(self.session.device.type), \
                    self.stop:
                if unevaluated:
                    resumed = self.checkpointing.resumed_from
                    if self.session.is_chief:
                        logger.info("%s has no evaluation result (its run stopped in it): "
                                    "evaluating it first", resumed)
                    with self.progress.paused():
                        result = self.checkpointing.evaluate(resumed, self.step)
                    self.session.model.train()
                while not self.done() and not self.stop.stopping:
                    result = self.run_epoch(train_input_path) or result
                    self.collections.full()
                self.stop.finish()  # the last step's signal reduction, every rank alike
                if self.progress.pending:  # the last steps' line (every rank alike)
                    self._report_progress()
                self._finish_timing()
                if self.checkpointing.last_saved != self.step:
                    result = self.checkpoint_and_evaluate(evaluate=not self.stop.stopping) \
                        or result
        finally:
            if self._inputs is not None:
                self._inputs.close()
            self.summaries.close()
        if self.stop.stopping:
            raise self.stop.interrupted(self.step, self.done(),
                                        bool(self.options.eval_input_path))
        self._log_end("")
        return result

    def _log_end(self, prefix: str) -> None:
        if not self.session.is_chief:
            return
        o = self.options
        if o.num_steps and self.step >= o.num_steps:
            why = f"num_steps {o.num_steps} reached"
        else:
            why = f"{self.epoch} of num_epochs {o.max_epochs} done"
            if o.num_steps:
                why += f" before num_steps {o.num_steps}"
        logger.info("%straining ends at step %d: %s", prefix, self.step, why)

    def _finish_timing(self) -> None:
        """Keep and write the step timing summary (before the final checkpoint)."""
        if self.timer.enabled:
            self.step_timing = self.timer.summary()
            extra = None
            if self.ctx.is_distributed:  # every rank's summary, in rank 0's file
                extra = {"ranks": all_gather_objects(self.step_timing, self.ctx)}
            self.timer.write(self.session.model_dir, self.session.rank, extra,
                             summary=self.step_timing)

    def _timed_hook(self, hook):
        """The model's embedding hook, marking the end of the embedding forward when timed."""
        if not self.timer.enabled:
            return hook
        self.session.model.embedding.set_backward_timer(
            self.timer.sub_timer("embedding_backward"))

        def timed(embedded):
            self.timer.mark("embedding_forward")
            return embedded if hook is None else hook(embedded)

        return timed

    def run_epoch(self, train_input_path: str) -> dict | None:
        """One pass over the input, or up to ``num_steps``; returns the last eval result."""
        result, batches = None, 0
        self.timer.begin()
        if self._inputs is None or self._inputs_path != train_input_path:
            if self._inputs is not None:
                self._inputs.close()
            self._inputs_path = train_input_path
            self._inputs = EpochStream(
                lambda first, count: self.train_stream(train_input_path, first, count))
        skip, self._skip = self._skip, 0
        if skip and self.session.is_chief:
            logger.info("epoch %d: reading past the %d batches trained before step %d",
                        self.epoch, skip, self.step)
        batches_in = self._inputs.epoch(self.epoch, self.options.max_epochs, skip)
        prefetcher = DevicePrefetcher(batches_in, self.session.device, self.prepare_ahead)
        for batch in prefetcher:
            self.timer.batch_ready()
            self.progress.start()
            if self._random_state is not None:
                checkpoints.set_random_states(self.session.model, self._random_state)
                self._random_state = None
            self.train_step(batch, prefetcher.upcoming)
            batches += 1
            self.epoch_step += 1
            self.collections.step(self.step)
            if self.dumper is not None and self.step % self.dumper.interval_steps == 0:
                with self.collections.automatic(), self.progress.paused():
                    logger.info("incremental dump %s", self.dumper.dump(self.step))
            if self.checkpointing.due_at_step(self.step):
                with self.collections.automatic():
                    result = self.checkpoint_and_evaluate() or result
            if self.options.num_steps and self.step >= self.options.num_steps \
                    or self.stop.check():
                return result
        if batches == 0 and not skip:
            raise self._no_batches(train_input_path)
        self.epoch += 1
        self.epoch_step = 0
        if self.checkpointing.due_at_epoch(self.epoch) \
                and self.checkpointing.last_saved != self.step:
            with self.collections.automatic():
                result = self.checkpoint_and_evaluate() or result
        return result

    def _no_batches(self, path: str) -> TrainError:
        """The error of an epoch without a step: under several ranks, one that says why a
        rank's share of the input can be empty."""
        head = f"train input {path!r} gave no batches in epoch {self.epoch}"
        if self.session.world_size == 1 or self._shares is None or min(self._shares[3]):
            return TrainError(f"{head}; check the path and data_config.batch_size")
        return TrainError(f"{head}: {empty_shares(*self._shares)}")

    def train_stream(self, path: str, first: int, count: int | None):
        """``EpochStream``'s loader from epoch ``first`` on, its items per epoch, the
        batches per epoch of every rank (the fewest any rank has), this rank's, and the
        rows of a full batch."""
        loader = self.session.train_stream(path, first, count)
        s, workers, dataset = self.session, loader.num_workers, loader.dataset
        if self.ctx.is_distributed:
            check_same_input(dataset, path, self.ctx, "train")
        readers = dataset.reader_batches(s.rank, workers)
        per_rank = [sum(dataset.reader_batches(rank, workers)) for rank in range(s.world_size)]
        self._shares = (int(dataset.num_rows), int(dataset.options.batch_size), workers,
                        per_rank, bool(dataset.options.drop_remainder))
        return (loader, max(readers) * max(workers, 1), min_over_ranks(min(per_rank), self.ctx),
                sum(readers), int(dataset.options.batch_size))

    def train_step(self, batch, upcoming=None) -> None:
        """One step on ``batch``; ``upcoming(k)`` gives the k-th batch after it (or None),
        whose id deduplication the step starts ahead: the next batch's at its start, or
        with ``prepare_ahead`` 2 the one after the next at its end (the next batch's at
        the start too when no earlier step prepared it)."""
        s = self.session
        timer = self.timer
        batch = batch.to(s.device, non_blocking=True)
        timer.mark("data_wait")
        following = upcoming() if upcoming is not None else None
        if following is not None and not s.model.embedding.is_prepared(following.sparse):
            s.model.embedding.prepare(following.sparse)
        targets = s.model.targets(batch)  # labels, then the row weights if any, ...
        if self.weighted_loss is not None:
            self.weighted_loss.start(s.model.target_weights(targets))
        lrs = s.set_learning_rates(self.step, self.epoch)
        if self.gradients is None:
            s.dense.zero_grad()
        else:
            self.gradients.zero()
        losses, logits = self.dense_graphs.losses_and_logits(
            s.model.embed(batch, self.embedding_hook), batch, targets)
        if self.train_metrics:  # before the next replay overwrites a graph's logits
            self.train_metrics.update(s.model.batch_predictions(logits, batch), batch,
                                      self.step + 1)
        if self.weighted_loss is not None:
            losses = self.weighted_loss.scale(losses)
        timer.mark("dense_forward")
        weights = None
        if self.loss_weights is None:
            loss = sum(losses.values())
        else:  # its per-loss backward passes count in the backward's time
            loss, solved = self.loss_weights.weigh(
                losses, self._losses_again if self.dense_graphs.replayed else None)
            weights = dict(zip(self.loss_weights.names, solved.unbind(0)))
        s.precision.backward(loss)
        timer.mark("backward")
        if self.gradients is not None:
            self.gradients.all_reduce()
        s.precision.unscale(self.dense_optimizer)
        clip_gradients(self.parameters, self.grad_clipping)
        s.precision.step(self.dense_optimizer)
        if upcoming is not None and self.prepare_ahead == 2:
            after = upcoming(2)
            if after is not None:
                s.model.embedding.prepare(after.sparse)
        timer.mark("optimizer")
        self.step += 1
        self.progress.record(batch.batch_size, loss.detach(), losses)
        if weights is not None:
            self.progress.record_weights(weights)
        self._lrs = lrs
        if self.progress.due(self.step):
            self._report_progress()
        timer.mark("logging")
        timer.end_step(batch.batch_size)

    def _losses_again(self) -> dict:
        """The step's losses from a new replay of its dense graph, as the step scaled them
        (``DenseGraphs.replay_again``; for the Pareto weights' backward passes)."""
        losses = self.dense_graphs.replay_again()
        return losses if self.weighted_loss is None else self.weighted_loss.scale(losses)

    def _report_progress(self) -> None:
        """The progress line of the steps since the last one, with its summaries."""
        s, timer, lrs = self.session, self.timer, self._lrs
        embedding = s.model.embedding
        counters = global_table_counters(table_counters(
            embedding.dynamic_tables(), embedding.fused_table_sizes()), self.ctx)
        counters.update(zch_counters(embedding.zch_remappers))  # replicated: not summed
        o, inputs = self.options, self._inputs
        total = total_steps(o.num_steps, o.max_epochs, inputs.steps if inputs else 0)
        window = self.progress.report(self.step, lrs, counters,
                                      comm=s.model.embedding.comm_timer.drain(), total=total,
                                      metrics=self.train_metrics.values())
        self.summaries.scalars(self.step, {**window, **{f"lr/{k}": v for k, v in lrs.items()}})
        self.summaries.tables(self.step, counters)
        if timer.enabled:
            phases = timer.drain()
            logger.info("step %d | %s", self.step, format_phases(phases))
            self.summaries.scalars(self.step, phases, prefix="step_ms/")

    def checkpoint_and_evaluate(self, evaluate: bool = True) -> dict | None:
        """Save a checkpoint at the current step, then evaluate when an eval input is set
        (and ``evaluate``), outside the progress line's samples/s."""
        self.progress.check_finite(self.step)
        with self.progress.paused():
            return self.checkpointing.save(self.step, self.epoch, self.epoch_step, evaluate)


def scales_to_global_mean(model, ctx) -> bool:
    """Whether ``model``'s losses are scaled to their weighted mean over every rank's rows
    (``WeightedLossScale``): under several ranks, for a model whose losses weigh rows,
    unless it asks for each rank's own mean (dlrm_hstu's enable_global_average_loss
    false, ``local_loss_mean``)."""
    return bool(ctx.is_distributed and getattr(model, "weighted", False)
                and not getattr(model, "local_loss_mean", False))
