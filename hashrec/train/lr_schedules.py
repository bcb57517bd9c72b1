"""Learning-rate schedules as pure functions of (step, epoch).

A schedule is stateless: ``schedule(step, epoch) -> lr``. The trainer asks it
before every step and sets the dense optimizer's param groups and the sparse
optimizer (``EmbeddingCollection.set_learning_rate``), so a resumed run gets
the same learning rate as an uninterrupted one from the step alone.

``step`` is the number of training steps already taken (0 for the first) and
``epoch`` the number of completed epochs; ``by_epoch`` schedules count epochs. An
optimizer whose ``lr`` is 0 keeps 0 under every schedule (as in TorchEasyRec: a zero
rate freezes what it updates).
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from hashrec.train.errors import TrainError


@dataclass(frozen=True)
class ConstantSchedule:
    """Always ``base_lr``."""

    base_lr: float

    def __call__(self, step: int, epoch: int = 0) -> float:
        return self.base_lr


@dataclass(frozen=True)
class ExponentialDecaySchedule:
    """Linear warmup, then ``base_lr * decay_factor ** (t / decay_size)``, floored.

    During the first ``warmup_size`` units the rate goes linearly from
    ``warmup_learning_rate`` to ``base_lr``; after it, ``t`` counts from the end of
    the warmup; ``staircase`` floors ``t / decay_size``; the rate never drops below
    ``min_learning_rate``.
    """

    base_lr: float
    decay_size: int
    decay_factor: float = 0.95
    staircase: bool = True
    warmup_learning_rate: float = 0.0
    warmup_size: int = 0
    min_learning_rate: float = 0.0
    by_epoch: bool = False

    def __post_init__(self) -> None:
        if self.decay_size <= 0:
            raise ValueError(
                f"exponential_decay_learning_rate.decay_size={self.decay_size}; allowed: > 0")
        if not 0 < self.decay_factor <= 1:
            raise ValueError(
                f"exponential_decay_learning_rate.decay_factor={self.decay_factor}; "
                f"allowed: (0, 1]")

    def __call__(self, step: int, epoch: int = 0) -> float:
        t = epoch if self.by_epoch else step
        if self.base_lr == 0:
            return 0.0
        if t < self.warmup_size:
            frac = t / self.warmup_size
            return self.warmup_learning_rate + (self.base_lr - self.warmup_learning_rate) * frac
        exponent = (t - self.warmup_size) / self.decay_size
        if self.staircase:
            exponent = math.floor(exponent)
        return max(self.base_lr * self.decay_factor ** exponent, self.min_learning_rate)


@dataclass(frozen=True)
class ManualStepSchedule:
    """``learning_rates[i]`` once ``t`` is past ``schedule_sizes[i]`` (``t >
    schedule_sizes[i]``, as TorchEasyRec's ManualStepLR counts); ``base_lr`` up to the
    first boundary.

    With ``warmup`` the rate up to the first boundary goes linearly from ``base_lr`` (at
    ``t`` 0) to ``learning_rates[0]`` (at the boundary) instead of staying at ``base_lr``.
    """

    base_lr: float
    schedule_sizes: tuple[int, ...]
    learning_rates: tuple[float, ...]
    warmup: bool = False
    by_epoch: bool = False

    def __post_init__(self) -> None:
        if len(self.schedule_sizes) != len(self.learning_rates):
            raise ValueError(
                f"manual_step_learning_rate: {len(self.schedule_sizes)} schedule_sizes but "
                f"{len(self.learning_rates)} learning_rates; they must pair up")
        if list(self.schedule_sizes) != sorted(set(self.schedule_sizes)):
            raise ValueError(
                f"manual_step_learning_rate.schedule_sizes={list(self.schedule_sizes)} must be "
                f"strictly increasing")
        if self.warmup and (not self.schedule_sizes or self.schedule_sizes[0] <= 0):
            raise ValueError("manual_step_learning_rate.warmup needs schedule_sizes[0] > 0")

    def __call__(self, step: int, epoch: int = 0) -> float:
        t = epoch if self.by_epoch else step
        if self.base_lr == 0:
            return 0.0
        passed = bisect.bisect_left(self.schedule_sizes, t)  # boundaries below t
        if passed:
            return self.learning_rates[passed - 1]
        if self.warmup:
            frac = t / self.schedule_sizes[0]
            return self.base_lr + (self.learning_rates[0] - self.base_lr) * frac
        return self.base_lr


def _start(schedule, step: int, epoch: int) -> tuple[int, float | None]:
    """(t, the rate if it is decided before the decay: 0 for a zero ``base_lr``, or the
    linear warmup's from ``warmup_learning_rate`` to ``base_lr`` over ``warmup_size``)."""
    t = epoch if schedule.by_epoch else step
    if schedule.base_lr == 0:
        return t, 0.0
    if t >= schedule.warmup_size:
        return t, None
    lr = schedule.warmup_learning_rate + (
        schedule.base_lr - schedule.warmup_learning_rate) * t / schedule.warmup_size
    return t, lr


def _cosine(base_lr: float, min_learning_rate: float, t: float, period: float) -> float:
    """Half a cosine from ``base_lr`` (t 0) to ``min_learning_rate`` (t ``period``)."""
    return min_learning_rate + (base_lr - min_learning_rate) * 0.5 * (
        1 + math.cos(math.pi * t / period))


@dataclass(frozen=True)
class LinearDecaySchedule:
    """Linear warmup, then a line from ``base_lr`` to ``min_learning_rate`` at
    ``total_size`` (warmup included); ``min_learning_rate`` after it."""

    base_lr: float
    total_size: int
    min_learning_rate: float = 0.0
    warmup_learning_rate: float = 0.0
    warmup_size: int = 0
    by_epoch: bool = False

    def __post_init__(self) -> None:
        if self.total_size <= self.warmup_size:
            raise ValueError(
                f"linear_decay_learning_rate.total_size={self.total_size}; allowed: above "
                f"warmup_size ({self.warmup_size})")

    def __call__(self, step: int, epoch: int = 0) -> float:
        t, early = _start(self, step, epoch)
        if early is not None:
            return early
        span = self.total_size - self.warmup_size
        left = 1 - min(t - self.warmup_size, span) / span
        return self.min_learning_rate + (self.base_lr - self.min_learning_rate) * left


@dataclass(frozen=True)
class CosineAnnealingSchedule:
    """Linear warmup, then half a cosine from ``base_lr`` to ``min_learning_rate`` over
    ``T_max`` (counted from the warmup's end); ``min_learning_rate`` after it."""

    base_lr: float
    T_max: int
    min_learning_rate: float = 0.0
    warmup_learning_rate: float = 0.0
    warmup_size: int = 0
    by_epoch: bool = False

    def __post_init__(self) -> None:
        if self.T_max <= 0:
            raise ValueError(f"cosine_annealing_learning_rate.T_max={self.T_max}; allowed: > 0")

    def __call__(self, step: int, epoch: int = 0) -> float:
        t, early = _start(self, step, epoch)
        if early is not None:
            return early
        return _cosine(self.base_lr, self.min_learning_rate,
                       min(t - self.warmup_size, self.T_max), self.T_max)


@dataclass(frozen=True)
class CosineAnnealingWarmRestartsSchedule:
    """Linear warmup, then half-cosines from ``base_lr`` to ``min_learning_rate`` that
    restart at ``base_lr``: the first over ``T_0``, each next ``T_mult`` times as long."""

    base_lr: float
    T_0: int
    T_mult: int = 1
    min_learning_rate: float = 0.0
    warmup_learning_rate: float = 0.0
    warmup_size: int = 0
    by_epoch: bool = False

    def __post_init__(self) -> None:
        where = "cosine_annealing_warm_restarts_learning_rate"
        if self.T_0 <= 0:
            raise ValueError(f"{where}.T_0={self.T_0}; allowed: > 0")
        if self.T_mult < 1:
            raise ValueError(f"{where}.T_mult={self.T_mult}; allowed: 1 or more")

    def __call__(self, step: int, epoch: int = 0) -> float:
        t, early = _start(self, step, epoch)
        if early is not None:
            return early
        # Walk the periods (integers: no rounding at a restart's boundary).
        elapsed, period = t - self.warmup_size, self.T_0
        while elapsed >= period:
            elapsed -= period
            period *= self.T_mult
        return _cosine(self.base_lr, self.min_learning_rate, elapsed, period)


SCHEDULES = ("constant_learning_rate", "exponential_decay_learning_rate",
             "manual_step_learning_rate", "linear_decay_learning_rate",
             "cosine_annealing_learning_rate", "cosine_annealing_warm_restarts_learning_rate")


def build_schedule(optimizer_config, base_lr: float, where: str):
    """The schedule an optimizer config's ``learning_rate`` oneof names.

    Args:
        optimizer_config: a message with a ``learning_rate`` oneof (``SparseOptimizer``,
            ``DenseOptimizer``, ``ParamLearningRate``, ``PartOptimizer``).
        base_lr: the optimizer's ``lr``.
        where: config path for error messages (``train_config.dense_optimizer``).

    Raises:
        TrainError: invalid schedule settings.
    """
    kind = optimizer_config.WhichOneof("learning_rate")
    if kind in (None, "constant_learning_rate"):
        return ConstantSchedule(base_lr)
    c = getattr(optimizer_config, kind)
    try:
        if kind == "exponential_decay_learning_rate":
            return ExponentialDecaySchedule(
                base_lr, c.decay_size, c.decay_factor, c.staircase, c.warmup_learning_rate,
                c.warmup_size, c.min_learning_rate, c.by_epoch)
        if kind == "manual_step_learning_rate":
            return ManualStepSchedule(base_lr, tuple(c.schedule_sizes),
                                      tuple(c.learning_rates), c.warmup, c.by_epoch)
        if kind == "linear_decay_learning_rate":
            return LinearDecaySchedule(base_lr, c.total_size, c.min_learning_rate,
                                       c.warmup_learning_rate, c.warmup_size, c.by_epoch)
        if kind == "cosine_annealing_learning_rate":
            return CosineAnnealingSchedule(base_lr, c.T_max, c.min_learning_rate,
                                           c.warmup_learning_rate, c.warmup_size, c.by_epoch)
        if kind == "cosine_annealing_warm_restarts_learning_rate":
            return CosineAnnealingWarmRestartsSchedule(
                base_lr, c.T_0, c.T_mult, c.min_learning_rate, c.warmup_learning_rate,
                c.warmup_size, c.by_epoch)
    except ValueError as err:
        raise TrainError(f"{where}: {err}") from err
    raise TrainError(f"{where}.{kind} is not supported; allowed: {', '.join(SCHEDULES)}")
