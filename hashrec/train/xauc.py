"""XAUC and grouped XAUC: how often pairs of rows are ordered by the prediction as by the
label (for labels of many values, such as watch times).

A pair (i, j) counts 1 where ``(label_i - label_j) * (pred_i - pred_j) > 0`` and 0 otherwise,
so a pair of equal labels or equal predictions counts 0, as in TorchEasyRec. ``xauc`` is the
mean over pairs drawn uniformly, with replacement, from all n (n - 1) / 2 pairs of the
evaluation (``max_pairs`` of them, else ``sample_ratio`` of all, at least one), or over every
pair where that many draws would reach their number; ``in_batch`` instead averages each
evaluation batch's mean over all of its pairs. ``grouped_xauc`` does the same within each
group of rows sharing a ``grouping_key`` id (``max_pairs_per_group`` draws, every pair of a
group with no more) and averages the groups of two or more rows, weighted by their rows.

The draws come from a generator of fixed seed, so an evaluation's result is reproducible.
Like the grouped AUC these metrics keep every evaluated row until ``compute`` (in_batch
keeps two numbers), and under several ranks ``sync`` gathers the rows on every rank.
"""

from __future__ import annotations

import math

import torch

from hashrec.train.grouped_auc import gather_rows

_SEED = 0x5A0C


def _pair_positions(counts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """For pair numbers k (n,) int64 within a group, positions (i, j), 0 <= i < j, such that
    the pairs of a group of s rows are numbered 0 .. s (s - 1) / 2 - 1 as (0,1), (0,2), (1,2),
    (0,3), ..."""
    j = torch.floor((1 + torch.sqrt(1 + 8 * counts.double())) / 2).long()
    # float rounding: put j back in the run of k where it is off by one
    j = j - (j * (j - 1) // 2 > counts).long()
    j = j + ((j + 1) * j // 2 <= counts).long()
    return counts - j * (j - 1) // 2, j


def grouped_pair_agreement(preds: torch.Tensor, labels: torch.Tensor, sizes: torch.Tensor,
                           draws: int, generator: torch.Generator) -> torch.Tensor:
    """Each group's share of ordered pairs (G,) float64.

    Args:
        preds: (n,) predictions, the rows of a group consecutive.
        labels: (n,) labels, in the same order.
        sizes: (G,) int64 rows of each group (each 2 or more; they sum to n).
        draws: pairs drawn for a group; a group with no more pairs than that uses each once.
        generator: draws the pairs (CPU).
    """
    sizes = sizes.long()
    starts = torch.cumsum(sizes, 0) - sizes
    pairs = sizes * (sizes - 1) // 2
    exact = pairs <= draws
    taken = torch.where(exact, pairs, torch.full_like(pairs, draws))
    group = torch.repeat_interleave(torch.arange(sizes.numel()), taken)
    first = torch.cumsum(taken, 0) - taken
    local = torch.arange(int(taken.sum())) - first[group]
    drawn = torch.floor(torch.rand(local.numel(), generator=generator, dtype=torch.float64)
                        * pairs[group].double()).long()
    k = torch.where(exact[group], local, torch.minimum(drawn, pairs[group] - 1))
    i, j = _pair_positions(k)
    i, j = i + starts[group], j + starts[group]
    p, y = preds.double(), labels.double()
    ordered = ((y[i] - y[j]) * (p[i] - p[j]) > 0).double()
    agree = torch.zeros(sizes.numel(), dtype=torch.float64).index_add_(0, group, ordered)
    return agree / taken.double()


class XAUC:
    """The share of ordered pairs of the evaluation's rows (see the module docstring).

    Args:
        sample_ratio: the share of all pairs drawn, in (0, 1] (without max_pairs).
        max_pairs: pairs drawn; 0: sample_ratio decides.
        in_batch: average each batch's share over all its pairs instead.
        device: where the rows are kept until ``compute``.
    """

    def __init__(self, sample_ratio: float = 1e-3, max_pairs: int = 0, in_batch: bool = False,
                 device=None) -> None:
        if not 0 < sample_ratio <= 1:
            raise ValueError(f"xauc sample_ratio={sample_ratio}; allowed: above 0, at most 1")
        self.sample_ratio = sample_ratio
        self.max_pairs = int(max_pairs)
        self.in_batch = in_batch
        self.device = device
        self._parts: list[tuple[torch.Tensor, torch.Tensor]] = []
        # in_batch: the sum of the batches' shares, and the batches (of 2 or more rows)
        self._batches = torch.zeros(2, dtype=torch.float64)

    def update(self, preds: torch.Tensor, labels: torch.Tensor) -> None:
        """Add predictions (n,) and labels (n,)."""
        preds = preds.detach().float().reshape(-1)
        labels = labels.detach().float().reshape(-1)
        if self.in_batch:
            n = preds.numel()
            if n >= 2:
                share = grouped_pair_agreement(preds.cpu(), labels.cpu(), torch.tensor([n]),
                                               n * (n - 1) // 2, torch.Generator())
                self._batches += torch.stack([share[0], torch.ones((), dtype=torch.float64)])
            return
        self._parts.append((preds, labels))

    def _rows(self) -> tuple[torch.Tensor, torch.Tensor]:
        if not self._parts:
            return torch.zeros(0), torch.zeros(0)
        preds, labels = zip(*self._parts)
        return torch.cat(preds).cpu(), torch.cat(labels).cpu()

    def sync(self) -> None:
        """Every rank's rows (or batch shares) on every rank."""
        if self.in_batch:
            self._batches = gather_rows([self._batches])[0].reshape(-1, 2).sum(0)
            return
        self._parts = [tuple(gather_rows(list(self._rows())))]

    def draws(self, rows: int) -> int:
        """Pairs drawn from ``rows`` rows."""
        if self.max_pairs:
            return self.max_pairs
        return max(1, math.ceil(rows * (rows - 1) // 2 * self.sample_ratio))

    def compute(self) -> float:
        """The share of ordered pairs; NaN with fewer than two rows."""
        if self.in_batch:
            total, batches = self._batches.tolist()
            return total / batches if batches else float("nan")
        preds, labels = self._rows()
        n = preds.numel()
        if n < 2 or not bool(torch.isfinite(preds).all()):
            return float("nan")
        generator = torch.Generator().manual_seed(_SEED)
        return float(grouped_pair_agreement(preds, labels, torch.tensor([n]), self.draws(n),
                                            generator)[0])

    def undefined_reason(self) -> str:
        """Why the XAUC is NaN ("" where it is not)."""
        if self.in_batch:
            return "" if self._batches[1] else "no evaluation batch holds two rows"
        preds, _ = self._rows()
        if not bool(torch.isfinite(preds).all()):
            return f"{int((~torch.isfinite(preds)).sum())} predictions were NaN or infinite"
        return "" if preds.numel() >= 2 else f"the evaluation has {preds.numel()} rows"


class GroupedXAUC:
    """Row-weighted mean of each group's share of ordered pairs (see the module docstring).

    Args:
        grouping_key: the feature whose id groups the rows.
        max_pairs_per_group: pairs drawn in each group (1 or more).
        device: where the rows are kept until ``compute``.
    """

    def __init__(self, grouping_key: str, max_pairs_per_group: int = 100, device=None) -> None:
        if max_pairs_per_group < 1:
            raise ValueError(f"grouped_xauc max_pairs_per_group={max_pairs_per_group}; "
                             f"allowed: 1 or more")
        self.grouping_key = grouping_key
        self.max_pairs_per_group = int(max_pairs_per_group)
        self.device = device
        # Whether rows without one id each were warned about (``metrics.grouping_ids``).
        self.warned = False
        self._parts: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = []

    def update(self, preds: torch.Tensor, labels: torch.Tensor, groups: torch.Tensor) -> None:
        """Add predictions (n,), labels (n,) and group ids (n,) int64."""
        if not (preds.numel() == labels.numel() == groups.numel()):
            raise ValueError(f"grouped_xauc: {preds.numel()} predictions, {labels.numel()} "
                             f"labels and {groups.numel()} group ids")
        self._parts.append((preds.detach().float().reshape(-1),
                            labels.detach().float().reshape(-1),
                            groups.detach().reshape(-1).to(torch.int64)))

    def _rows(self) -> list[torch.Tensor]:
        if not self._parts:
            return [torch.zeros(0), torch.zeros(0), torch.zeros(0, dtype=torch.int64)]
        return [torch.cat(column).cpu() for column in zip(*self._parts)]

    def sync(self) -> None:
        """Every rank's rows on every rank."""
        self._parts = [tuple(gather_rows(self._rows()))]

    def compute(self) -> float:
        """The groups' row-weighted mean; NaN where no group has two rows."""
        preds, labels, groups = self._rows()
        if not bool(torch.isfinite(preds).all()):
            return float("nan")
        order = torch.argsort(groups, stable=True)
        _, sizes = torch.unique_consecutive(groups[order], return_counts=True)
        kept = torch.repeat_interleave(sizes >= 2, sizes)
        order, sizes = order[kept], sizes[sizes >= 2]
        if sizes.numel() == 0:
            return float("nan")
        generator = torch.Generator().manual_seed(_SEED)
        shares = grouped_pair_agreement(preds[order], labels[order], sizes,
                                        self.max_pairs_per_group, generator)
        return float((shares * sizes.double()).sum() / sizes.sum())

    def undefined_reason(self) -> str:
        """Why the grouped XAUC is NaN ("" where it is not)."""
        preds, _, groups = self._rows()
        if not bool(torch.isfinite(preds).all()):
            return f"{int((~torch.isfinite(preds)).sum())} predictions were NaN or infinite"
        if math.isnan(self.compute()):
            return (f"no group of {self.grouping_key!r} holds two rows "
                    f"({groups.numel()} rows, {groups.unique().numel()} groups)")
        return ""
