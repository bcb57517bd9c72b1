"""What the trainer does differently under torchrun: lockstep steps, planning, global counters.

Every rank runs the same steps: embedding lookups and the dense-gradient
all-reduce are collectives. The data loader gives each rank's workers contiguous
shares of the rows cut at whole batches (``hashrec.data.sharding``: ranks differ
by at most one batch), so ranks may still end an epoch with different batch
counts. The training and the eval input are checked, as they start, to be the same
files on every rank (:func:`check_same_input`), since the shares are cut by position:

* training runs, every epoch, as many steps as the rank with the fewest batches
  has: the counts follow from the row count (``hashrec.data.sharding.slot_batches``),
  so every rank knows them without a per-step exchange (one :func:`min_over_ranks`
  when the training input starts);
  the at most one extra batch of the other ranks is skipped, as with
  ``drop_remainder``;
* evaluation runs until every rank is done; a rank whose input ran out serves
  its peers' lookups with no batch of its own (:func:`eval_batches`), so no row
  is left out of the metrics. The same per-batch reduction carries the stop signal
  of an evaluation inside training: all ranks stop before the same batch.

The storage planner runs on rank 0 at start; its choice (HBM_ONLY, HYBRID or
CACHING and the cache_load_factor of each dynamic storage) is broadcast and
applied to every rank's tables, and the plan is logged as a table.
"""

from __future__ import annotations

import hashlib
import logging
import os
from collections.abc import Callable, Iterable, Iterator

import torch
import torch.distributed as dist

from hashrec.data import DataError
from hashrec.distributed import (
    DistContext,
    PlannerTable,
    all_reduce_scalars,
    detect_topology,
    plan_tables,
    plan_to_table,
    single_process_context,
)
from hashrec.distributed.errors import DistributedError
from hashrec.distributed.process_group import all_gather_objects, all_reduce_int
from hashrec.distributed.side_exchange import run_aside
from hashrec.embedding.plan import plan_storages
from hashrec.train.interrupt import StopSignals

logger = logging.getLogger("hashrec.train")


def min_over_ranks(value: int, ctx: DistContext) -> int:
    """The smallest of every rank's ``value`` (``value`` itself on one rank)."""
    return all_reduce_int(value, ctx, dist.ReduceOp.MIN)


def check_same_input(dataset, path: str, ctx: DistContext, mode: str) -> None:
    """Every rank must see the same input (``mode`` train or eval): ranks split its rows
    by position, so ranks that list other files (a path relative to another working
    directory, a folder that differs between hosts) would train or count some rows twice
    and others never. A collective: every rank calls it for the same input.

    Raises:
        DataError: the ranks' files (names and row counts, in order) differ.
    """
    pieces = [(os.path.basename(p.path), int(p.num_rows)) for p in dataset.pieces]
    digest = hashlib.sha256(repr(pieces).encode()).hexdigest()[:16]
    seen = all_gather_objects((digest, len({p.path for p in dataset.pieces}),
                               int(dataset.num_rows)), ctx)
    if len({entry[0] for entry in seen}) > 1:
        ranks = "; ".join(f"rank {r}: {files} files, {rows} rows"
                          for r, (_, files, rows) in enumerate(seen))
        raise DataError(f"{mode} input {path!r} differs between ranks ({ranks}); every rank "
                        f"must read the same files (use an absolute path on a shared file "
                        f"system)")


def eval_batches(batches: Iterable, ctx: DistContext, idle: Callable[[], None],
                 max_steps: int = 0, signals: StopSignals | None = None) -> Iterator:
    """Yield this rank's batches until every rank is done; call ``idle`` when only peers have one.

    Args:
        batches: this rank's batches.
        ctx: the worker's context.
        idle: serves the peers' collectives for one step (``EmbeddingCollection.idle_lookups``).
        max_steps: stop after this many steps on every rank (0: the whole input).
        signals: the run's stop signals (an evaluation inside training): once any rank has
            received one, every rank stops before the same batch and ``signals.agreed``
            names the signal (the largest number where ranks received different ones).
    """
    iterator, steps = iter(batches), 0
    while not max_steps or steps < max_steps:
        batch = next(iterator, None)
        # One host-side reduction per batch answers both questions: the largest over
        # ranks of (signal << 1) | has a batch.
        received = (signals.received or 0) if signals is not None else 0
        state = all_reduce_int((received << 1) | (batch is not None), ctx, dist.ReduceOp.MAX)
        if state >> 1:
            signals.agreed = state >> 1
            return
        if not state & 1:
            return
        steps += 1
        if batch is None:
            idle()
        else:
            yield batch


def _broadcast_object(value, ctx: DistContext):
    if not ctx.is_distributed:
        return value
    box = [value]
    dist.broadcast_object_list(box, src=0, device=ctx.device if ctx.backend == "nccl" else None)
    return box[0]


def _planner_tables(feature_set, sparse_spec, ctx: DistContext) -> list[PlannerTable]:
    readers: dict[str, int] = {}
    for feature in feature_set.embedding_features():
        readers[feature.table] = readers.get(feature.table, 0) + 1
    out = []
    for plan in plan_storages(feature_set.embedding_tables(), sparse_spec, ctx.device,
                              ctx.world_size, note_splits=False):
        if not plan.is_dynamic:
            continue
        options = plan.options
        # What the config sets is kept (an explicit cache_load_factor 1.0 included); the
        # planner chooses the rest.
        out.append(PlannerTable.sharded(
            plan.name, options, ctx.world_size,
            fixed_cache_load_factor="cache_load_factor" in options.set_by_user,
            fixed_caching="caching" in options.set_by_user,
            ids_per_sample=float(sum(readers.get(t.name, 0) for t in plan.tables)),
            trainable=plan.trainable))
    return out


def plan_storage_modes(feature_set, sparse_spec, batch_size: int, ctx: DistContext | None,
                       purpose: str = "training") -> dict[str, tuple[float, bool]]:
    """Storage name -> (cache_load_factor, caching) the planner chose (same on every rank);
    ``purpose`` (training, evaluation, export, a tool's name) labels the plan's log line.

    Raises:
        DistributedError: no plan fits (a ``PlannerError`` naming the tables), on every rank.
    """
    ctx = ctx or single_process_context("cpu")
    reply: tuple[dict, str | None] = ({}, None)
    if ctx.is_main:
        try:
            tables = _planner_tables(feature_set, sparse_spec, ctx)
            if tables:
                plan = plan_tables(tables, detect_topology(ctx.world_size, ctx.device),
                                   max(1, batch_size))
                logger.info("storage plan for %d rank(s), %s:\n%s", ctx.world_size,
                            _plan_label(purpose, batch_size), plan_to_table(plan))
                reply = ({t.name: (t.variant.cache_load_factor, t.variant.caching)
                          for t in plan.tables}, None)
        except (DistributedError, ValueError) as err:
            reply = ({}, f"{type(err).__name__}: {err}")
    choice, error = _broadcast_object(reply, ctx)
    if error is not None:
        raise DistributedError(f"storage planning failed: {error}")
    return choice


def _plan_label(purpose: str, batch_size: int) -> str:
    """What a storage plan is for: ``training batch 1024 per rank``; a process that runs
    no batches of its own (export, a tool) says the batch its costs assume."""
    if purpose in ("training", "evaluation"):
        return f"{purpose} batch {batch_size} per rank"
    return f"{purpose} (costs estimated at batch {batch_size} per rank)"


def global_table_counters(counters: dict[str, dict[str, float]], ctx: DistContext
                          ) -> dict[str, dict[str, float]]:
    """Per-rank table counters summed over the shards (load_factor recomputed)."""
    if not ctx.is_distributed:
        return counters
    flat = {f"{table}\t{name}": value for table, c in counters.items()
            for name, value in c.items() if name != "load_factor"}
    summed = all_reduce_scalars(flat, ctx)
    out: dict[str, dict[str, float]] = {table: {} for table in counters}
    for key, value in summed.items():
        table, name = key.split("\t")
        out[table][name] = value
    for c in out.values():
        c["load_factor"] = c["size"] / c["capacity"] if c.get("capacity") else 0.0
    return out


class WeightedLossScale:
    """Makes the ranks' weighted-mean losses average to the global weighted mean.

    With sample weights each rank's loss is its rows' weighted mean sum(w * l) / W_r;
    the dense gradients are then averaged over ranks, which weighs every rank alike.
    Scaling rank r's loss by ``world * W_r / W`` (W the weights' sum over all ranks)
    makes that average sum over every row of w * l, divided by W: the loss one process
    reading the global batch trains on. A multi-task model's weights (B, losses), a
    column per loss (``RankModel.target_weights``), give each loss its own factor.
    ``start`` sends this rank's sums: on CUDA an
    all-reduce on the side stream of ``hashrec.distributed.side_exchange`` (the step's
    forward goes on, and the captured exchanges it replays are ordered after it, as
    two collectives of one communicator must never overlap); ``scale`` orders the
    training stream after it.
    """

    def __init__(self, ctx: DistContext) -> None:
        self.ctx = ctx
        self._local = self._total = self._event = None

    def start(self, weights: torch.Tensor) -> None:
        """Sends this rank's weight sums: weights (B,) -> (1,), (B, losses) -> (losses,)."""
        self._local = weights.sum(dim=0, dtype=torch.float32).reshape(-1)

        def reduce() -> torch.Tensor:
            total = self._local.clone()
            dist.all_reduce(total, op=dist.ReduceOp.SUM)
            return total

        if self._local.is_cuda:
            self._total, self._event = run_aside(self._local.device, reduce, (self._local,))
        else:
            self._total = reduce()

    def scale(self, losses: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        """``losses`` times this step's factors, one per loss in order, or one for all
        (0 on a rank whose weights, or the task's, are all 0)."""
        if self._event is not None:
            torch.cuda.current_stream(self._local.device).wait_event(self._event)
            self._total.record_stream(torch.cuda.current_stream(self._local.device))
            self._event = None
        tiny = torch.finfo(torch.float32).tiny
        factors = self._local * self.ctx.world_size / self._total.clamp_min(tiny)
        if len(factors) not in (1, len(losses)):
            raise ValueError(f"WeightedLossScale: {len(factors)} weight columns for "
                             f"{len(losses)} losses; expected 1 or one per loss")
        return {name: loss * factors[i if len(factors) > 1 else 0]
                for i, (name, loss) in enumerate(losses.items())}
