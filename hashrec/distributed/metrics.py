"""Metrics summed across ranks, and logging from rank 0 only.

Metrics that are sums (loss totals, sample counts, AUC score histograms) are
all-reduced; a rank's mean is never averaged with another rank's mean, so ranks
with different batch counts still give the exact global value.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import torch
import torch.distributed as dist

from hashrec.distributed.process_group import DistContext


def all_reduce_sum(tensor: torch.Tensor, ctx: DistContext,
                   group: dist.ProcessGroup | None = None) -> torch.Tensor:
    """Sum a tensor over ranks (a new tensor; the input is left untouched).

    Args:
        tensor: any shape; moved to ``ctx.device`` for the collective.
        ctx: the worker's context (no collective without a process group).
        group: process group (default group when None).

    Returns:
        The element-wise sum over ranks, on ``ctx.device``.
    """
    out = tensor.detach().to(ctx.device, copy=True)
    if ctx.is_distributed:
        dist.all_reduce(out, op=dist.ReduceOp.SUM, group=group)
    return out


def all_reduce_scalars(values: Mapping[str, float], ctx: DistContext,
                       group: dist.ProcessGroup | None = None) -> dict[str, float]:
    """Sum named scalars over ranks with one collective.

    Args:
        values: name -> this rank's partial sum (e.g. ``{"loss_sum": 12.5, "samples": 64}``).
        ctx: the worker's context.

    Returns:
        name -> sum over ranks (float64 arithmetic), same on every rank, in the order of
        ``values`` (which the ranks need not share: the collective sums them by name).
    """
    names = sorted(values)
    local = torch.tensor([float(values[name]) for name in names], dtype=torch.float64)
    summed = dict(zip(names, all_reduce_sum(local, ctx, group).cpu().tolist()))
    return {name: summed[name] for name in values}


def mean_over_ranks(total: float, count: float, ctx: DistContext,
                    group: dist.ProcessGroup | None = None) -> float:
    """Global mean from per-rank sums: sum(total) / sum(count) (0.0 when no samples)."""
    sums = all_reduce_scalars({"count": count, "total": total}, ctx, group)
    return sums["total"] / sums["count"] if sums["count"] > 0 else 0.0


def auc_from_histograms(positive: torch.Tensor, negative: torch.Tensor) -> float:
    """ROC AUC from score histograms (bins ascending by score), ties counted as 1/2.

    Args:
        positive: (bins,) count of positive samples per score bin.
        negative: (bins,) count of negative samples per score bin.

    Returns:
        AUC in [0, 1]; 0.5 when either class is empty.
    """
    pos, neg = positive.to(torch.float64), negative.to(torch.float64)
    num_pos, num_neg = float(pos.sum()), float(neg.sum())
    if num_pos == 0 or num_neg == 0:
        return 0.5
    neg_below = torch.cumsum(neg, 0) - neg
    wins = (pos * (neg_below + 0.5 * neg)).sum()
    return float(wins) / (num_pos * num_neg)


def score_histograms(scores: torch.Tensor, labels: torch.Tensor,
                     num_bins: int = 10000) -> tuple[torch.Tensor, torch.Tensor]:
    """Bin probabilities in [0, 1] into positive and negative histograms (int64, (num_bins,)).

    Summing these over ranks (:func:`all_reduce_sum`) and calling
    :func:`auc_from_histograms` gives the global AUC up to the bin width.

    Raises:
        ValueError: a score is NaN (it falls in no bin).
    """
    if bool(torch.isnan(scores).any()):
        raise ValueError(f"score_histograms: {int(torch.isnan(scores).sum())} of "
                         f"{scores.numel()} scores are NaN")
    bins = (scores.detach().clamp(0.0, 1.0) * num_bins).to(torch.int64).clamp_(max=num_bins - 1)
    is_pos = labels.detach().reshape(-1) > 0.5
    bins = bins.reshape(-1)
    positive = torch.bincount(bins[is_pos], minlength=num_bins)
    negative = torch.bincount(bins[~is_pos], minlength=num_bins)
    return positive, negative


def global_auc(scores: torch.Tensor, labels: torch.Tensor, ctx: DistContext,
               num_bins: int = 10000, group: dist.ProcessGroup | None = None) -> float:
    """AUC over every rank's samples (histogram approximation, bin width 1/num_bins)."""
    positive, negative = score_histograms(scores, labels, num_bins)
    both = all_reduce_sum(torch.stack([positive, negative]), ctx, group)
    return auc_from_histograms(both[0].cpu(), both[1].cpu())


class RankZeroLogger:
    """A logger facade that emits on rank 0 and stays silent elsewhere.

    Args:
        logger: the logger to write to.
        ctx: the worker's context.
    """

    def __init__(self, logger: logging.Logger, ctx: DistContext) -> None:
        self.logger = logger
        self.enabled = ctx.is_main

    def info(self, msg: str, *args) -> None:
        if self.enabled:
            self.logger.info(msg, *args)

    def warning(self, msg: str, *args) -> None:
        if self.enabled:
            self.logger.warning(msg, *args)

    def error(self, msg: str, *args) -> None:
        # Errors are worth seeing from every rank: a failing rank may not be rank 0.
        self.logger.error(msg, *args)
