"""Streaming evaluation metrics whose memory does not grow with the data.

``BinnedAUC`` is the ROC curve at ``thresholds`` evenly spaced thresholds from 0 to 1
(both included), integrated with the trapezoid rule, as TorchEasyRec's
``torchmetrics.AUROC(thresholds=...)``: a probability p lies in the bin of the highest
threshold at or below it (so 1.0 has a bin of its own), and the two histograms
(positives and negatives) give the Mann-Whitney statistic, a negative in a lower bin
than a positive counting 1, one in the same bin 1/2. It equals the exact AUC when no
bin holds both a positive and a negative; otherwise the error is at most half the share
of positive-negative pairs that fall in one bin (the statistic is
``hashrec.distributed.metrics.auc_from_histograms``). Every metric's state is a
few tensors that ``sync`` sums across ranks, so distributed evaluation needs one
all-reduce per metric. The metrics of a task of several classes (``multiclass_auc``, a
multi-class ``accuracy``) are in ``hashrec.train.class_metrics``.
"""

from __future__ import annotations

import logging

import torch
import torch.distributed as dist

from hashrec.distributed.metrics import auc_from_histograms
from hashrec.train.errors import TrainError
from hashrec.train.grouped_auc import GroupedAUC
from hashrec.train.xauc import XAUC, GroupedXAUC

logger = logging.getLogger("hashrec.train")


def all_reduce_tensors(tensors: list[torch.Tensor]) -> None:
    """Sums each tensor over the ranks in place (nothing outside torch.distributed)."""
    if dist.is_available() and dist.is_initialized():
        for t in tensors:
            dist.all_reduce(t)


class BinnedAUC:
    """Area under the ROC curve from score histograms.

    Args:
        num_bins: the number of thresholds (``auc.thresholds``), evenly spaced over
            [0, 1] from 0 to 1: as many bins, the last one holding 1.0 alone.
        device: where the histograms live (the predictions' device).
    """

    def __init__(self, num_bins: int = 200, device=None) -> None:
        if num_bins < 2:
            raise TrainError(f"auc thresholds={num_bins}; allowed: >= 2")
        self.num_bins = num_bins
        # The thresholds as torchmetrics makes them (float32), so that a probability equal
        # to one lands where torchmetrics' comparison puts it; p * (num_bins - 1) rounded
        # down can fall one bin short there.
        self.thresholds = torch.linspace(0, 1, num_bins, device=device)
        self.positives = torch.zeros(num_bins, dtype=torch.float64, device=device)
        self.negatives = torch.zeros(num_bins, dtype=torch.float64, device=device)
        # predictions that were NaN or infinite: they make the AUC NaN, not a bin's count
        self.nonfinite = torch.zeros(1, dtype=torch.float64, device=device)

    def update(self, probs: torch.Tensor, labels: torch.Tensor) -> None:
        """Add probabilities (n,) in [0, 1] and binary labels (n,)."""
        # contiguous: a two-class task's probs1 is a strided column, which bucketize
        # would copy with a UserWarning
        probs = probs.detach().float().reshape(-1).to(self.positives.device).contiguous()
        labels = labels.detach().reshape(-1).to(self.positives.device)
        # Bin k holds the probabilities that the k-th threshold, k / (num_bins - 1),
        # calls positive (p >= it) and the next one does not.
        bins = (torch.bucketize(probs, self.thresholds, right=True) - 1).clamp_(
            0, self.num_bins - 1)
        positive = (labels > 0.5).to(torch.float64)
        # index_add_ reads nothing back (bincount and boolean masks wait for the device).
        self.positives.index_add_(0, bins, positive)
        self.negatives.index_add_(0, bins, 1.0 - positive)
        self.nonfinite += (~torch.isfinite(probs)).sum()

    def sync(self) -> None:
        all_reduce_tensors([self.positives, self.negatives, self.nonfinite])

    def compute(self) -> float:
        """AUC in [0, 1]; NaN when one class is absent or a prediction was not finite
        (``undefined_reason`` says which)."""
        if self.undefined_reason():
            return float("nan")
        return auc_from_histograms(self.positives, self.negatives)

    def undefined_reason(self) -> str:
        """Why the AUC is NaN ("" where it is not)."""
        positives, negatives = int(self.positives.sum()), int(self.negatives.sum())
        if self.nonfinite.item():
            return f"{int(self.nonfinite.item())} predictions were NaN or infinite"
        if positives == 0 or negatives == 0:
            return (f"the evaluation has {positives} positive and {negatives} negative rows; "
                    f"an AUC needs both")
        return ""


class SoftLabels:
    """Counts the rows whose label lies strictly between 0 and 1 (soft labels, which
    binary_cross_entropy and binary_focal_loss train on), for the metrics that read a
    label as a class (auc, grouped_auc, accuracy: positive where it is > 0.5)."""

    def __init__(self, device=None) -> None:
        self.total = torch.zeros(2, dtype=torch.float64, device=device)  # soft, rows

    def update(self, labels: torch.Tensor) -> None:
        labels = labels.detach().reshape(-1).to(self.total.device)
        soft = ((labels > 0) & (labels < 1)).sum().to(torch.float64)
        self.total += torch.stack([soft, torch.full_like(soft, labels.numel())])

    def sync(self) -> None:
        all_reduce_tensors([self.total])

    def warn(self, label_name: str, metric_names: list[str]) -> None:
        """One warning naming the metrics that threshold the soft labels, if any were
        added."""
        soft, rows = (int(v) for v in self.total.tolist())
        if soft:
            logger.warning("label column %r: %d of %d evaluated rows hold a soft label "
                           "(strictly between 0 and 1); %s count a row positive where its "
                           "label is > 0.5", label_name, soft, rows, ", ".join(metric_names))


class _MeanOf:
    """Mean of a per-example quantity."""

    def __init__(self, device=None) -> None:
        self.total = torch.zeros(2, dtype=torch.float64, device=device)

    def values(self, probs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def update(self, probs: torch.Tensor, labels: torch.Tensor) -> None:
        v = self.values(probs.detach().float().reshape(-1), labels.detach().float().reshape(-1))
        count = torch.full((), float(v.numel()), dtype=torch.float64, device=v.device)
        self.total += torch.stack([v.double().sum(), count]).to(self.total.device)

    def sync(self) -> None:
        all_reduce_tensors([self.total])

    def compute(self) -> float:
        return float(self.total[0] / self.total[1]) if self.total[1] > 0 else float("nan")


class RecallAtK(_MeanOf):
    """A match model's recall@k, as TorchEasyRec computes it: the share of rows whose
    positive item is among the k items of highest similarity (k at most the columns)."""

    def __init__(self, top_k: int, device=None) -> None:
        super().__init__(device)
        self.top_k = top_k

    def update(self, similarity: torch.Tensor, positive: str,
               mask: torch.Tensor | None = None) -> None:
        """``similarity`` (B, K); ``positive``: each row's positive at column i of row i
        ("diagonal") or at column 0 ("first"), as ``hashrec.models.losses.match_loss``;
        ``mask`` (B,) bool: the rows counted (None: every row; hstu_match's queries
        beyond a row's positives are not)."""
        similarity = similarity.detach().float()
        rows = similarity.shape[0]
        top = torch.topk(similarity, min(self.top_k, similarity.shape[1]), dim=1).indices
        target = torch.arange(rows, device=top.device) if positive == "diagonal" \
            else torch.zeros(rows, dtype=top.dtype, device=top.device)
        hits = (top == target.unsqueeze(1)).any(dim=1).double()
        counted = torch.ones_like(hits) if mask is None else mask.to(hits.device).double()
        self.total += torch.stack([(hits * counted).sum(), counted.sum()]).to(self.total.device)


def metric_key(config) -> str:
    """A metric's result key (before a task's suffix): its kind; ``recall@<top_k>`` for
    recall_at_k, as TorchEasyRec names it (several top_k may be listed)."""
    kind = config.WhichOneof("metric")
    return f"recall@{config.recall_at_k.top_k}" if kind == "recall_at_k" else kind


class Accuracy(_MeanOf):
    """Share of rows whose thresholded probability equals the label."""

    def __init__(self, threshold: float = 0.5, device=None) -> None:
        super().__init__(device)
        self.threshold = threshold

    def values(self, probs, labels):
        right = ((probs > self.threshold).float() == (labels > 0.5).float()).float()
        return torch.where(torch.isfinite(probs), right, torch.nan)  # NaN in, NaN out


class MeanSquaredError(_MeanOf):
    def values(self, probs, labels):
        return (probs - labels) ** 2


class MeanAbsoluteError(_MeanOf):
    def values(self, probs, labels):
        return (probs - labels).abs()


class MeanLoss(_MeanOf):
    """Sum over ``terms`` loss terms (a multi-task model's task losses) of each term's
    mean of per-batch values, weighted by each batch's size or by the sum of its row
    weights (see ``add``); a term whose weights sum to 0 adds 0. Also counts the
    examples."""

    def __init__(self, device=None, terms: int = 1) -> None:
        super().__init__(device)
        # Rows: sum of loss x weight, sum of weight, rows; a column per term.
        self.total = torch.zeros(3, terms, dtype=torch.float64, device=device)

    def add(self, loss: float | torch.Tensor, count: int,
            weight: torch.Tensor | None = None) -> None:
        """Add a batch's mean ``loss`` (a float, a device scalar or (terms,), not read
        back) over ``count`` rows; ``weight``: the sum of its rows' weights (scalar or
        (terms,)), when the loss is their weighted mean."""
        device = self.total.device
        loss = torch.as_tensor(loss, device=device).detach().to(torch.float64).reshape(-1)
        weight = torch.full_like(loss, float(count)) if weight is None else \
            torch.as_tensor(weight, device=device).detach().to(torch.float64).reshape(-1)
        weight = weight.expand_as(loss)  # one weight sum for every term (a single task's)
        self.total += torch.stack([loss * weight, weight, torch.full_like(loss, count)])

    def compute(self) -> float:
        return float(sum(self.terms()))

    def terms(self) -> list[float]:
        """Each term's mean (NaN for every term where no example was added)."""
        if self.total[2, 0] <= 0:
            return [float("nan")] * self.total.shape[1]
        tiny = torch.finfo(torch.float64).tiny
        return (self.total[0] / self.total[1].clamp_min(tiny)).tolist()

    @property
    def examples(self) -> int:
        """Rows added (summed over ranks after ``sync``)."""
        return int(self.total[2, 0])


SUPPORTED_METRICS = ("auc", "accuracy", "mean_squared_error", "mean_absolute_error",
                     "grouped_auc", "multiclass_auc", "xauc", "grouped_xauc")


def build_metrics(metric_configs, device=None, regression: bool = False,
                  num_class: int = 1, match: bool = False) -> dict:
    """Metric name -> metric object from a task's ``metrics`` (default: auc; for a
    ``regression`` model, mean_squared_error; for a task of ``num_class`` > 2 classes,
    multiclass_auc, macro-averaged at 200 thresholds; for a ``match`` task, none, as
    TorchEasyRec's match models report none unless listed). With two classes auc reads the
    second class's probability (``probs1``), as in TorchEasyRec; with classes accuracy is
    the top-k accuracy. The settings were checked when the session was built
    (:func:`check_metrics`).

    Raises:
        TrainError: a metric kind that is not supported.
    """
    from hashrec.train.class_metrics import MulticlassBinnedAUC, TopKAccuracy

    metrics: dict = {}
    for config in metric_configs:
        kind = config.WhichOneof("metric")
        if kind == "auc":
            metrics["auc"] = BinnedAUC(int(config.auc.thresholds), device)
        elif kind == "multiclass_auc":
            metrics["multiclass_auc"] = MulticlassBinnedAUC(
                num_class, int(config.multiclass_auc.thresholds),
                config.multiclass_auc.average, device)
        elif kind == "accuracy":
            metrics["accuracy"] = Accuracy(config.accuracy.threshold, device) \
                if num_class == 1 else TopKAccuracy(num_class, config.accuracy.top_k, device)
        elif kind == "mean_squared_error":
            metrics["mean_squared_error"] = MeanSquaredError(device)
        elif kind == "mean_absolute_error":
            metrics["mean_absolute_error"] = MeanAbsoluteError(device)
        elif kind == "grouped_auc":
            metrics["grouped_auc"] = GroupedAUC(config.grouped_auc.grouping_key, device)
        elif kind == "xauc":
            options = config.xauc
            metrics["xauc"] = XAUC(options.sample_ratio, options.max_pairs, options.in_batch,
                                   device)
        elif kind == "grouped_xauc":
            options = config.grouped_xauc
            metrics["grouped_xauc"] = GroupedXAUC(options.grouping_key,
                                                  options.max_pairs_per_group, device)
        elif kind == "recall_at_k" and match:
            metrics[metric_key(config)] = RecallAtK(int(config.recall_at_k.top_k), device)
        else:
            raise TrainError(f"model_config.metrics: {kind!r} is not supported; allowed: "
                             f"{', '.join(SUPPORTED_METRICS)}")
    if metrics or match:
        return metrics
    if regression:
        return {"mean_squared_error": MeanSquaredError(device)}
    if num_class > 2:
        return {"multiclass_auc": MulticlassBinnedAUC(num_class, 200, "macro", device)}
    return {"auc": BinnedAUC(200, device)}


def check_metrics(model_config, feature_set) -> None:
    """Refuses, before any training, metric settings the evaluation could not run: a
    metric listed twice (a result holds one value a metric), a grouped_auc grouping_key
    (or a jrc_loss session_name) that is not an id feature of ``feature_set``, a metric
    that does not fit the task's classes (see :func:`class_problem`); warns about
    metrics of binary labels on a regression model (l2_loss); each task's of a multi-task
    model; and train_metrics training could not compute (``check_train_metrics``)."""
    from hashrec.models.tasks import model_tasks
    from hashrec.train.train_metrics import check_train_metrics

    for task in model_tasks(model_config, feature_set.label_fields,
                            feature_set.sample_weight_fields):
        _check_task_metrics(task, feature_set)
        check_train_metrics(task)


def check_listed(configs, num_class: int, where: str, shown: str) -> None:
    """Refuses a metric that ``configs`` (listed at ``where``) hold twice (``shown``: where
    its one value goes) or that does not fit a task of ``num_class`` logits."""
    kinds = [metric_key(config) for config in configs]
    twice = sorted({kind for kind in kinds if kinds.count(kind) > 1})
    if twice:
        raise TrainError(f"{where} lists {', '.join(twice)} more than once; {shown} holds "
                         f"one value a metric: keep one")
    for config in configs:
        problem = class_problem(config, num_class)
        if problem:
            raise TrainError(f"{where}: {problem}")


def _check_task_metrics(task, feature_set) -> None:
    kinds = [config.WhichOneof("metric") for config in task.metric_configs]
    check_listed(task.metric_configs, task.num_class, f"{task.where}.metrics",
                 "an evaluation result")
    for config in task.metric_configs:
        kind = config.WhichOneof("metric")
        if kind in ("grouped_auc", "grouped_xauc"):
            _check_id_feature(getattr(config, kind).grouping_key, feature_set,
                              f"{task.where}.metrics: {kind} grouping_key",
                              "whose id groups the rows")
    jrc = task.loss_of("jrc_loss")
    if jrc is not None:
        _check_id_feature(jrc.session_name, feature_set,
                          f"{task.where}.losses: jrc_loss session_name",
                          "whose first id a row is the row's session")
    binary = [kind for kind in kinds if kind in ("auc", "grouped_auc", "accuracy")]
    if task.regression and binary:
        logger.warning("%s.metrics: %s on a regression model (l2_loss) count "
                       "labels above 0.5 as positives and read its prediction y as a "
                       "probability (the AUC bins clamp it into [0, 1])", task.where,
                       ", ".join(binary))


def class_problem(config, num_class: int) -> str:
    """Why a metric does not fit a task of ``num_class`` logits ("" where it does): auc and
    grouped_auc read one probability a row (num_class 1, or 2: the second class's, as
    TorchEasyRec allows); multiclass_auc needs classes; a multi-class task has no value
    ``y`` for mean_squared_error and mean_absolute_error; accuracy's top_k ranks classes; xauc
    and grouped_xauc order rows by one prediction a row, as auc."""
    kind = config.WhichOneof("metric")
    if kind in ("auc", "grouped_auc", "xauc", "grouped_xauc") and num_class > 2:
        return (f"{kind} reads one probability a row; the task has {num_class} classes: use "
                f"multiclass_auc")
    if kind == "multiclass_auc" and num_class == 1:
        return ("multiclass_auc needs a task of classes (num_class 2 or more, "
                "softmax_cross_entropy); this task has one logit: use auc")
    if kind in ("mean_squared_error", "mean_absolute_error") and num_class > 1:
        return (f"{kind} compares a value y with the label; a task of {num_class} classes "
                f"predicts probabilities: use accuracy or multiclass_auc")
    if kind == "accuracy":
        top_k = config.accuracy.top_k
        if num_class == 1 and top_k != 1:
            return (f"accuracy.top_k={top_k}: the task has one logit, so top_k is 1 (leave it "
                    f"unset); top_k ranks the classes of a task with num_class > 1")
        if not 1 <= top_k <= max(num_class, 1):
            return f"accuracy.top_k={top_k}; allowed: 1 to num_class ({num_class})"
    return ""


def _check_id_feature(key: str, feature_set, what: str, why: str) -> None:
    """``key`` names an id feature of ``feature_set``; else a TrainError naming ``what``
    (the field, where it is set) and ``why`` it needs one."""
    ids = feature_set.id_features()
    if key not in ids:
        # The features giving ids are id and combo features and raw features bucketized by
        # boundaries: the list says so, so that a raw feature in it is no surprise.
        raise TrainError(f"{what} {key!r} is not an id feature; it must name one of "
                         f"feature_configs' features that give ids (id features, or raw "
                         f"features with boundaries: {', '.join(ids) or 'none'}), {why}")


def grouping_ids(batch, metric: GroupedAUC | GroupedXAUC) -> torch.Tensor:
    """Each row's id of the metric's feature (B,) int64, for grouped_auc and grouped_xauc:
    its first id, 0 for a row without one (TorchEasyRec's rule; a warning says so, once a
    metric)."""
    from hashrec.models.rank_model import first_ids

    key = metric.grouping_key
    bags = batch.sparse[key]
    lengths = bags.lengths
    if bags.values.numel() == batch.batch_size and bool((lengths == 1).all()):
        return bags.values
    if not metric.warned:
        metric.warned = True
        kind = "grouped_auc" if isinstance(metric, GroupedAUC) else "grouped_xauc"
        logger.warning("%s: feature %r gives a row %d to %d ids; rows are grouped by their "
                       "first id, rows without one as id 0 (as in TorchEasyRec)",
                       kind, key, int(lengths.min()), int(lengths.max()))
    return first_ids(bags)
