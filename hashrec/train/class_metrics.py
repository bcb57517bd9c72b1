"""Streaming metrics of a task of C > 1 classes (softmax_cross_entropy, jrc_loss).

Both read the task's ``probs`` (B, C) and its class ids (B,), keep one float64 state
tensor whose size does not grow with the data, and ``sync`` sums it across ranks in one
all-reduce, as the binary metrics of ``hashrec.train.metrics`` do.

``MulticlassBinnedAUC`` is torchmetrics' ``MulticlassAUROC(thresholds=..., average=...)``
(TorchEasyRec's ``multiclass_auc``): each class's one-vs-rest ROC AUC of its probability
column at ``thresholds`` evenly spaced thresholds from 0 to 1, computed as
``BinnedAUC`` does for one column, then averaged over the classes whose AUC is defined
(rows of the class and rows of others both present): ``macro`` alike, ``weighted`` by
each class's support (its rows). A class without rows has no AUC and stays out of the
average (torchmetrics gives it 0 and so lowers a macro average; its weight in a weighted
one is 0 either way); with no class defined the metric is NaN, as ``auc`` of one label.

``TopKAccuracy`` is torchmetrics' ``MulticlassAccuracy(top_k=k)`` with its default
micro average (TorchEasyRec's ``accuracy`` of a multi-class task): the share of rows whose
class is among the k classes of highest probability (with k = 1, the first of the highest,
as ``argmax`` picks).
"""

from __future__ import annotations

import torch

from hashrec.config.validate import MULTICLASS_AUC_AVERAGES
from hashrec.train.errors import TrainError
from hashrec.train.metrics import all_reduce_tensors


class MulticlassBinnedAUC:
    """Averaged one-vs-rest AUC of C classes from per-class score histograms.

    Args:
        num_classes: C (>= 2).
        num_bins: the thresholds (``multiclass_auc.thresholds``, >= 2), evenly spaced over
            [0, 1]: as many bins, the last one holding 1.0 alone.
        average: ``macro`` or ``weighted`` (see the module docstring).
        device: where the histograms live (the predictions' device).
    """

    def __init__(self, num_classes: int, num_bins: int = 200, average: str = "macro",
                 device=None) -> None:
        if num_classes < 2:
            raise TrainError(f"multiclass_auc of {num_classes} class; allowed: 2 or more")
        if num_bins < 2:
            raise TrainError(f"multiclass_auc thresholds={num_bins}; allowed: >= 2")
        if average not in MULTICLASS_AUC_AVERAGES:
            raise TrainError(f"multiclass_auc average={average!r}; allowed: "
                             f"{', '.join(MULTICLASS_AUC_AVERAGES)}")
        self.num_classes, self.num_bins, self.average = num_classes, num_bins, average
        # torchmetrics' float32 thresholds, so that a probability on one falls where
        # torchmetrics puts it (as BinnedAUC).
        self.thresholds = torch.linspace(0, 1, num_bins, device=device)
        # Histograms [class, class's rows / other rows, bin], flat, then the count of
        # predictions that were not finite (they make the AUC NaN).
        self.state = torch.zeros(num_classes * 2 * num_bins + 1, dtype=torch.float64,
                                 device=device)

    def update(self, probs: torch.Tensor, labels: torch.Tensor) -> None:
        """Add probabilities (n, C) and class ids (n,)."""
        device = self.state.device
        probs = probs.detach().float().reshape(-1, self.num_classes).to(device).contiguous()
        classes = labels.detach().reshape(-1).to(device).long()
        bins = (torch.bucketize(probs, self.thresholds, right=True) - 1).clamp_(
            0, self.num_bins - 1)
        other = (classes.unsqueeze(-1) != torch.arange(self.num_classes, device=device))
        slot = (torch.arange(self.num_classes, device=device) * 2 + other.long()) \
            * self.num_bins + bins
        self.state.index_add_(0, slot.reshape(-1),
                              torch.ones(slot.numel(), dtype=torch.float64, device=device))
        self.state[-1:] += (~torch.isfinite(probs)).sum()

    def sync(self) -> None:
        all_reduce_tensors([self.state])

    def class_aucs(self) -> torch.Tensor:
        """Each class's AUC (C,) float64, NaN where it has no rows or every row is its."""
        hist = self.state[:-1].reshape(self.num_classes, 2, self.num_bins)
        pos, neg = hist[:, 0], hist[:, 1]
        wins = (pos * (torch.cumsum(neg, -1) - neg + 0.5 * neg)).sum(-1)
        pairs = pos.sum(-1) * neg.sum(-1)
        return torch.where(pairs > 0, wins / pairs.clamp_min(1), torch.nan)

    def compute(self) -> float:
        """The averaged AUC; NaN when no class has one or a prediction was not finite."""
        if self.state[-1].item():
            return float("nan")
        aucs = self.class_aucs()
        defined = ~torch.isnan(aucs)
        if not bool(defined.any()):
            return float("nan")
        if self.average == "macro":
            return float(aucs[defined].mean())
        support = self.state[:-1].reshape(self.num_classes, 2, self.num_bins)[:, 0].sum(-1)
        weights = support[defined]
        return float((aucs[defined] * weights).sum() / weights.sum())


class TopKAccuracy:
    """Share of rows whose class is among the ``top_k`` most probable (see the module
    docstring); NaN once a prediction was not finite."""

    def __init__(self, num_classes: int, top_k: int = 1, device=None) -> None:
        if not 1 <= top_k <= num_classes:
            raise TrainError(f"accuracy top_k={top_k} of {num_classes} classes; allowed: 1 "
                             f"to {num_classes}")
        self.num_classes, self.top_k = num_classes, top_k
        # rows right, rows, predictions not finite
        self.state = torch.zeros(3, dtype=torch.float64, device=device)

    def update(self, probs: torch.Tensor, labels: torch.Tensor) -> None:
        """Add probabilities (n, C) and class ids (n,)."""
        device = self.state.device
        probs = probs.detach().float().reshape(-1, self.num_classes).to(device).contiguous()
        classes = labels.detach().reshape(-1).to(device).long()
        if self.top_k == 1:
            right = probs.argmax(dim=-1) == classes
        else:
            right = (probs.topk(self.top_k, dim=-1).indices == classes.unsqueeze(-1)).any(-1)
        self.state += torch.stack([right.sum(), torch.tensor(classes.numel(), device=device),
                                   (~torch.isfinite(probs)).sum()]).to(torch.float64)

    def sync(self) -> None:
        all_reduce_tensors([self.state])

    def compute(self) -> float:
        right, rows, nonfinite = self.state.tolist()
        if nonfinite or rows == 0:
            return float("nan")
        return right / rows
