"""Grouped AUC (GAUC): the mean, over groups, of each group's exact AUC.

Rows are grouped by one id feature (``grouped_auc { grouping_key: "user_id" }``: each
row's id of that feature, the raw id for dynamic tables). A group counts when it holds
both a positive and a negative row; its AUC is the Mann-Whitney statistic on its rows'
probabilities, ties counted 1/2 (average ranks). The result is the unweighted mean over
the groups that count, as TorchEasyRec reports it; NaN when no group counts.

Unlike the binned AUC this metric keeps every evaluated row (a probability, a label and
a group id: 16 bytes a row on the evaluation device) until ``compute``; under several
ranks ``sync`` gathers all rows on every rank.
"""

from __future__ import annotations

import math

import torch
import torch.distributed as dist


class GroupedAUC:
    """Mean per-group AUC over groups with both classes.

    Args:
        grouping_key: the feature whose id groups the rows (names the metric's input).
        device: where the rows are kept until ``compute``.
    """

    def __init__(self, grouping_key: str, device=None) -> None:
        self.grouping_key = grouping_key
        self.device = device
        # Whether rows without one id each were warned about (``metrics.grouping_ids``).
        self.warned = False
        self._parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def update(self, probs: torch.Tensor, labels: torch.Tensor, groups: torch.Tensor) -> None:
        """Add probabilities (n,), binary labels (n,) and group ids (n,) int64."""
        if not (probs.numel() == labels.numel() == groups.numel()):
            raise ValueError(f"grouped_auc: {probs.numel()} probabilities, {labels.numel()} "
                             f"labels and {groups.numel()} group ids")
        self._parts.append((probs.detach().float().reshape(-1), labels.detach().reshape(-1) > 0.5,
                            groups.detach().reshape(-1).to(torch.int64)))

    def _rows(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        if not self._parts:
            empty = torch.zeros(0, device=self.device)
            return empty, empty.bool(), empty.long()
        probs, labels, groups = zip(*self._parts)
        return torch.cat(probs), torch.cat(labels), torch.cat(groups)

    def sync(self) -> None:
        """Every rank's rows on every rank (a no-op without a process group)."""
        self._parts = [tuple(gather_rows(list(self._rows())))]

    def compute(self) -> float:
        """The mean AUC of the groups holding both classes; NaN when none does."""
        probs, labels, groups = (t.cpu() for t in self._rows())
        return grouped_auc(probs, labels, groups)

    def undefined_reason(self) -> str:
        """Why the grouped AUC is NaN ("" where it is not)."""
        probs, labels, groups = (t.cpu() for t in self._rows())
        if not bool(torch.isfinite(probs).all()):
            return f"{int((~torch.isfinite(probs)).sum())} predictions were NaN or infinite"
        if math.isnan(grouped_auc(probs, labels, groups)):
            return (f"no group of {self.grouping_key!r} holds both a positive and a negative "
                    f"row ({int(labels.sum())} positive rows of {labels.numel()})")
        return ""


def gather_rows(columns: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each column (n_rank, ...) concatenated over the ranks in rank order, on every rank and
    on the column's device; the columns themselves without a process group of several."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() == 1:
        return columns
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, [t.cpu() for t in columns])
    return [torch.cat([part[c] for part in gathered]).to(column.device)
            for c, column in enumerate(columns)]


def grouped_auc(probs: torch.Tensor, labels: torch.Tensor, groups: torch.Tensor) -> float:
    """Mean over groups with both classes of each group's AUC (ties 1/2), else NaN (and
    NaN when a score is not finite).

    Args:
        probs: (n,) scores.
        labels: (n,) bool, True for positives.
        groups: (n,) int64 group ids.
    """
    if probs.numel() == 0 or not bool(torch.isfinite(probs).all()):
        return float("nan")
    # Rows ordered by group, then score: each group's rows form one run.
    order = torch.argsort(probs.double(), stable=True)
    order = order[torch.argsort(groups[order], stable=True)]
    p, y, g = probs[order].double(), labels[order], groups[order]
    n = p.numel()
    new_group = torch.ones(n, dtype=torch.bool)
    new_group[1:] = g[1:] != g[:-1]
    group_id = torch.cumsum(new_group, 0) - 1
    starts = torch.nonzero(new_group).flatten()
    # Rank within the group, 1-based; tied scores share their average rank.
    rank = torch.arange(n, dtype=torch.float64) - starts[group_id].double() + 1
    new_tie = new_group.clone()
    new_tie[1:] |= p[1:] != p[:-1]
    tie_id = torch.cumsum(new_tie, 0) - 1
    ties = int(tie_id[-1]) + 1
    tie_sum = torch.zeros(ties, dtype=torch.float64).index_add_(0, tie_id, rank)
    tie_count = torch.zeros(ties, dtype=torch.float64).index_add_(
        0, tie_id, torch.ones(n, dtype=torch.float64))
    rank = (tie_sum / tie_count)[tie_id]
    count = int(group_id[-1]) + 1
    positive = y.double()
    pos = torch.zeros(count, dtype=torch.float64).index_add_(0, group_id, positive)
    size = torch.zeros(count, dtype=torch.float64).index_add_(
        0, group_id, torch.ones(n, dtype=torch.float64))
    rank_sum = torch.zeros(count, dtype=torch.float64).index_add_(0, group_id, rank * positive)
    neg = size - pos
    counted = (pos > 0) & (neg > 0)
    if not bool(counted.any()):
        return float("nan")
    auc = (rank_sum[counted] - pos[counted] * (pos[counted] + 1) / 2) / (
        pos[counted] * neg[counted])
    return float(auc.mean())
