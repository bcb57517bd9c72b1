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
has a value from its first fold on (at the steps divisible by ``decay_step``); the steps
after the last fold wait for the next.

Checkpoints carry the state (``state_dict``: per metric its kind, settings, folds, decayed
value or histograms, and the window of the steps since the last fold, summed over the
ranks), and a resumed run continues it (``load_state_dict``: the decayed state on every
rank, the window on rank 0 alone, so that the next fold's sum over the ranks holds it once,
under any number of ranks). A metric the checkpoint lacks, or holds with another kind or
other settings, starts fresh. ``grouped_auc``, ``xauc``,
``grouped_xauc`` and ``recall_at_k`` are refused here (their state grows with the rows or
groups): they are evaluation metrics (``metrics``).
"""

from __future__ import annotations

import logging
import math

import torch

from hashrec.train.class_metrics import MulticlassBinnedAUC, TopKAccuracy
from hashrec.train.errors import TrainError
from hashrec.train.evaluation import update_metrics
from hashrec.train.metrics import BinnedAUC, build_metrics, check_listed

logger = logging.getLogger("hashrec.train")
STATE_VERSION = 1  # of ``TrainMetrics.state_dict``

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

        self.kind = config.WhichOneof("metric")
        # The metric's own settings (thresholds, top_k ...; defaults filled in): a saved
        # state continues only a metric of the same kind and settings.
        own = getattr(config, self.kind)
        self.settings = {f.name: getattr(own, f.name) for f in own.DESCRIPTOR.fields}
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

    @property
    def decayed_states(self) -> list[torch.Tensor]:
        return _states(self.decayed) if self.histograms else [self.decayed]

    def load(self, saved: dict, window: bool) -> None:
        """Takes the state ``state_dict`` saved (shapes checked by the caller): the
        decayed state and folds, and the saved window where ``window`` (else an empty
        one); copied into the tensors in place."""
        for mine, theirs in zip(self.decayed_states, saved["decayed"]):
            mine.copy_(theirs)
        for mine, theirs in zip(self.states, saved["window"]):
            mine.copy_(theirs) if window else mine.zero_()
        self.folds = int(saved["folds"])


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
        """Add the step's predictions (``model.batch_predictions`` of its logits), then
        fold the windows of the metrics whose ``decay_step`` divides ``step`` (the steps
        trained)."""
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

    def state_dict(self) -> dict:
        """What a checkpoint keeps (CPU tensors): per metric name its kind, settings,
        folds, decayed state and window, the windows summed over the ranks. Under several
        ranks a collective (one all-reduce): every rank calls it, and each gets the sum."""
        windows = [state for _, metric in self.metrics.values() for state in metric.states]
        if self.reduce is not None and windows:
            flat = self.reduce(torch.cat([s.reshape(-1) for s in windows]))
            windows = [part.view_as(s).to(s.dtype) for part, s in
                       zip(flat.split([s.numel() for s in windows]), windows)]
        out = {}
        for name, (_, metric) in self.metrics.items():
            mine, windows = windows[:len(metric.states)], windows[len(metric.states):]
            out[name] = {"kind": metric.kind, "settings": dict(metric.settings),
                         "folds": metric.folds,
                         "decayed": [t.detach().cpu().clone() for t in metric.decayed_states],
                         "window": [t.detach().cpu().clone() for t in mine]}
        return {"version": STATE_VERSION, "metrics": out}

    def load_state_dict(self, state: dict | None, rank: int = 0, where: str = "") -> None:
        """Continues the metrics of ``state_dict`` (None: a checkpoint without it, saved
        before checkpoints carried train metrics: all start fresh). A metric continues
        where the state holds its name with its kind, settings and state shapes; the others
        start fresh. Every rank takes the decayed state, rank 0 alone the window (the
        ranks' sum). Rank 0 logs one INFO line of what continues and what starts fresh."""
        if not self.metrics:
            return
        say = logger.info if rank == 0 else (lambda *args: None)
        if state is None:
            say("%s holds no train metric state (saved before checkpoints carried it, or by "
                "a run without train_metrics): the train metrics start fresh", where)
            return
        saved = dict(state.get("metrics", {}))
        continued, fresh = [], []
        for name, (_, metric) in self.metrics.items():
            why = _mismatch(metric, saved.pop(name, None))
            if why is None:
                metric.load(state["metrics"][name], window=rank == 0)
                continued.append(name)
            else:
                fresh.append(f"{name} ({why})")
        parts = []
        if continued:
            parts.append(f"continue {', '.join(continued)}")
        if fresh:
            parts.append(f"start fresh: {', '.join(fresh)}")
        if saved:
            parts.append(f"the checkpoint's {', '.join(sorted(saved))} "
                         f"{'are' if len(saved) > 1 else 'is'} not in the config, dropped")
        say("%s: train metrics %s", where, "; ".join(parts))

    def values(self) -> dict[str, float]:
        """Name -> decayed value of the metrics folded at least once (host reads)."""
        out = {}
        for name, (_, metric) in self.metrics.items():
            value = metric.value()
            if value is not None:
                out[name] = value
        return out


def _mismatch(metric: DecayedMetric, saved: dict | None) -> str | None:
    """Why ``metric`` cannot continue ``saved`` (its entry of ``state_dict``), or None."""
    if saved is None:
        return "not in the checkpoint"
    if saved["kind"] != metric.kind:
        return f"saved as {saved['kind']}"
    if saved["settings"] != metric.settings:
        changed = sorted(k for k in set(saved["settings"]) | set(metric.settings)
                         if saved["settings"].get(k) != metric.settings.get(k))
        return "saved with " + ", ".join(
            f"{k} {saved['settings'].get(k)}, now {metric.settings.get(k)}" for k in changed)
    shapes = [tuple(t.shape) for t in saved["decayed"] + saved["window"]]
    if shapes != [tuple(t.shape) for t in metric.decayed_states + metric.states]:
        return "saved with another number of classes"
    return None
