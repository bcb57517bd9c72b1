"""Metrics of the training batches (``model_config.train_metrics``, a task tower's
``train_metrics``), decayed over the steps as TorchEasyRec's ``TrainMetricConfig``.

Each metric adds every training batch's predictions (the dense step's logits, eager or
replayed as a CUDA graph: no extra forward) to a window kept on the device. Every
``decay_step`` steps the window is summed over the ranks (one all-reduce for the metrics
due at that step) and folded into the metric's running value, then cleared:

- ``accuracy``, ``mean_squared_error``, ``mean_absolute_error``: value = ``decay_rate`` x
  value + (1 - ``decay_rate``) x the window's value (the first window's value as it is);
- ``auc`` and ``multiclass_auc``: an AUC is no average of its windows' AUCs, so, as
  TorchEasyRec's ``DecayAUC``, the score histograms decay the same way (the first
  window's as they are) and the AUC is that of the decayed histograms.

No step reads anything back to the host: ``values`` does, at the progress line. A metric
has a value from its first ``decay_step`` steps on (a run's count, restarting with a
resumed run); the steps after the last fold wait for the next. ``grouped_auc``, ``xauc``,
``grouped_xauc`` and ``recall_at_k`` are refused here (their state grows with the rows or
groups): they are evaluation metrics (``metrics``).
"""

from __future__ import annotations

import math

import torch

from hashrec.train.class_metrics import MulticlassBinnedAUC, TopKAccuracy
from hashrec.train.errors import TrainError
from hashrec.train.evaluation import update_metrics
from hashrec.train.metrics import BinnedAUC, build_metrics, check_listed

TRAIN_METRICS = ("auc", "multiclass_auc", "accuracy", "mean_squared_error",
                 "mean_absolute_error")


def check_train_metrics(task) -> None:
    """Refuses a task's train_metrics that training could not compute: a kind other than
    ``TRAIN_METRICS``, one listed twice, one that does not fit the task's classes, a
    decay_rate outside [0, 1] or a decay_step of 0."""
    where = f"{task.where}.train_metrics"
    kinds = [config.WhichOneof("metric") for config in task.train_metric_configs]
    for kind in kinds:
        if kind not in TRAIN_METRICS:
            raise TrainError(f"{where}: {kind} is not computed on training batches (allowed: "
                             f"{', '.join(TRAIN_METRICS)}); list it under metrics to have it "
                             f"on the evaluation input")
    check_listed(task.train_metric_configs, task.num_class, where, "the progress line")
    for config in task.train_metric_configs:
        if not (math.isfinite(config.decay_rate) and 0 <= config.decay_rate <= 1):
            raise TrainError(f"{where}: {config.WhichOneof('metric')} decay_rate="
                             f"{config.decay_rate}; allowed: 0 to 1 (the weight of the value "
                             f"so far against a new window's)")
        if config.decay_step < 1:
            raise TrainError(f"{where}: {config.WhichOneof('metric')} decay_step=0; allowed: "
                             f">= 1 (the steps of a window)")


def _states(metric) -> list[torch.Tensor]:
    """The tensors a metric keeps (each a sum over its rows)."""
    if isinstance(metric, BinnedAUC):
        return [metric.positives, metric.negatives, metric.nonfinite]
    if isinstance(metric, (MulticlassBinnedAUC, TopKAccuracy)):
        return [metric.state]
    return [metric.total]


class DecayedMetric:
    """One train metric: a window of the steps since the last fold and its decayed value
    (see the module docstring).

    Args:
        config: a ``TrainMetricConfig``; ``num_class``, ``regression``: the task's.
    """

    def __init__(self, config, num_class: int, regression: bool, device=None) -> None:
        def build():
            return next(iter(build_metrics([config], device, regression, num_class).values()))

        self.rate = float(config.decay_rate)
        self.every = int(config.decay_step)
        self.window = build()
        self.histograms = isinstance(self.window, (BinnedAUC, MulticlassBinnedAUC))
        # The decayed histograms (auc), or the decayed value in float64 (the others).
        self.decayed = build() if self.histograms else \
            torch.zeros((), dtype=torch.float64, device=device)
        self.folds = 0

    @property
    def states(self) -> list[torch.Tensor]:
        return _states(self.window)

    def fold(self, window: list[torch.Tensor]) -> None:
        """Fold ``window`` (``states``, summed over the ranks) into the decayed value and
        clear the window; device work only."""
        keep = self.rate if self.folds else 0.0
        if self.histograms:
            for decayed, new in zip(_states(self.decayed), window):
                decayed.mul_(keep).add_(new, alpha=1.0 - keep if self.folds else 1.0)
        else:
            self.decayed.mul_(keep).add_(_window_value(self.window, window),
                                         alpha=1.0 - keep if self.folds else 1.0)
        for state in self.states:
            state.zero_()
        self.folds += 1

    def value(self) -> float | None:
        """The decayed value (a host read); None before the first fold."""
        if not self.folds:
            return None
        return self.decayed.compute() if self.histograms else float(self.decayed)


def _window_value(metric, window: list[torch.Tensor]) -> torch.Tensor:
    """The value of a mean metric's window state, on the device (NaN where it holds no row
    or, for a top-k accuracy, a prediction that was not finite)."""
    (state,) = window
    value = state[0] / state[1]
    if isinstance(metric, TopKAccuracy):
        value = torch.where(state[2] > 0, torch.nan, value)
    return value


class TrainMetrics:
    """The train metrics of a model's tasks.

    Args:
        tasks: the model's ``Task``s (their ``train_metric_configs``).
        reduce: sums a tensor over the ranks, returning the sum (None: one process).
    """

    def __init__(self, tasks, device=None, reduce=None) -> None:
        self.reduce = reduce
        # name (<metric>, or <metric>_<tower_name> of a multi-task model) -> (task, metric)
        self.metrics = {config.WhichOneof("metric") + task.suffix:
                        (task, DecayedMetric(config, task.num_class, task.regression, device))
                        for task in tasks for config in task.train_metric_configs}

    def __bool__(self) -> bool:
        return bool(self.metrics)

    def update(self, predictions: dict, batch, step: int) -> None:
        """Add the step's predictions (``model.predictions`` of its logits), then fold the
        windows of the metrics whose ``decay_step`` divides ``step`` (the steps trained)."""
        update_metrics([(task, metric.window) for task, metric in self.metrics.values()],
                       predictions, batch)
        due = [metric for _, metric in self.metrics.values() if step % metric.every == 0]
        if not due:
            return
        states = [state for metric in due for state in metric.states]
        if self.reduce is not None:  # one collective for every metric due
            flat = self.reduce(torch.cat([s.reshape(-1) for s in states]))
            states = [part.view_as(s) for part, s in
                      zip(flat.split([s.numel() for s in states]), states)]
        for metric in due:
            mine, states = states[:len(metric.states)], states[len(metric.states):]
            metric.fold(mine)

    def values(self) -> dict[str, float]:
        """Name -> decayed value of the metrics folded at least once (host reads)."""
        out = {}
        for name, (_, metric) in self.metrics.items():
            value = metric.value()
            if value is not None:
                out[name] = value
        return out
