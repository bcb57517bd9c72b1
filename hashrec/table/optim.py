"""Sparse optimizer specs: the state columns they add to each row and how they start.

A stored row is ``[embedding (dim) | optimizer state (state_dim(dim))]``, so one row
read serves one update. The update math lives in ``hashrec.table.ops.optimizer``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch


def _check_positive(name: str, value: float, allow_zero: bool = False) -> None:
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not allow_zero):
        bound = ">= 0" if allow_zero else "> 0"
        raise ValueError(f"{name}={value!r} is not valid; allowed: a finite number {bound}")


@dataclass(frozen=True)
class SparseSGD:
    """Plain SGD: ``w -= lr * g``. No state."""

    lr: float = 0.01

    def __post_init__(self) -> None:
        _check_positive("lr", self.lr, allow_zero=True)

    def state_dim(self, dim: int) -> int:
        return 0

    def initial_state(self, dim: int) -> torch.Tensor:
        return torch.zeros(0)


@dataclass(frozen=True)
class _AdagradFields:
    lr: float = 0.01
    initial_accumulator_value: float = 0.0
    eps: float = 1e-10

    def __post_init__(self) -> None:
        _check_positive("lr", self.lr, allow_zero=True)
        _check_positive("initial_accumulator_value", self.initial_accumulator_value, True)
        _check_positive("eps", self.eps, allow_zero=True)


@dataclass(frozen=True)
class SparseAdagrad(_AdagradFields):
    """Adagrad as ``torch.optim.Adagrad`` with sparse gradients (lr_decay 0, no weight decay).

    ``s += g * g; w -= lr * g / (sqrt(s) + eps)``; state = one accumulator per column.
    """

    def state_dim(self, dim: int) -> int:
        return dim

    def initial_state(self, dim: int) -> torch.Tensor:
        return torch.full((dim,), float(self.initial_accumulator_value))


@dataclass(frozen=True)
class SparseRowWiseAdagrad(_AdagradFields):
    """Row-wise Adagrad: one accumulator per row, fed the mean of the squared gradient.

    ``s += mean(g * g); w -= lr * g / (sqrt(s) + eps)``.
    """

    def state_dim(self, dim: int) -> int:
        return 1

    def initial_state(self, dim: int) -> torch.Tensor:
        return torch.full((1,), float(self.initial_accumulator_value))


@dataclass(frozen=True)
class SparseAdam:
    """Adam on touched rows, as dynamicemb's and FBGEMM TBE's; state = [m (dim) | v (dim)].

    Per element, with the global 1-based step t passed to the update::

        m = beta1 * m + (1 - beta1) * g;  v = beta2 * v + (1 - beta2) * g * g
        m_hat = m / (1 - beta1^t);  v_hat = v / (1 - beta2^t)
        w -= lr * (m_hat / (sqrt(v_hat) + eps) + weight_decay * w)

    ``eps`` is added after the bias correction, and ``weight_decay`` is decoupled: it
    shrinks the weight before the update directly, never enters g, m or v, and applies
    to touched rows only. Rows touched less often are corrected as if the step counter
    ran for them too (one counter for the table, as in those backends).
    """

    lr: float = 0.001
    beta1: float = 0.9
    beta2: float = 0.999
    eps: float = 1e-8
    weight_decay: float = 0.0

    def __post_init__(self) -> None:
        _check_positive("lr", self.lr, allow_zero=True)
        for name in ("beta1", "beta2"):
            value = getattr(self, name)
            _check_positive(name, value, allow_zero=True)
            if value >= 1.0:
                raise ValueError(f"{name}={value!r} is not valid; allowed: [0, 1)")
        _check_positive("eps", self.eps, allow_zero=True)
        _check_positive("weight_decay", self.weight_decay, allow_zero=True)

    def state_dim(self, dim: int) -> int:
        return 2 * dim

    def initial_state(self, dim: int) -> torch.Tensor:
        return torch.zeros(2 * dim)

    def folded_corrections(self, step: int) -> tuple[float, float]:
        """(scale, eps') at 1-based ``step`` with which ``scale * m / (sqrt(v) + eps')``
        equals ``m_hat / (sqrt(v_hat) + eps)``: the bias corrections folded into two
        scalars, so that an update reads the raw moments once."""
        root2 = math.sqrt(1.0 - self.beta2 ** step)
        return root2 / (1.0 - self.beta1 ** step), self.eps * root2


# The smallest float16 value (a subnormal); anything under half of it rounds to zero.
FLOAT16_TINY = 2.0 ** -24


def float16_state_floor(spec) -> float | None:
    """Gradient magnitude under which ``spec``'s squared-gradient state, stored in float16
    and starting at 0, rounds back to 0 after an update (Adagrad's accumulator, Adam's
    second moment); None for optimizers without such state (SGD), and for Adagrad whose
    accumulator starts at a value float16 keeps (it only grows from there)."""
    if isinstance(spec, SparseAdam):
        return math.sqrt(FLOAT16_TINY / 2 / (1.0 - spec.beta2))
    if isinstance(spec, _AdagradFields):
        if spec.initial_accumulator_value > FLOAT16_TINY / 2:
            return None  # rounds to at least the smallest float16 above 0
        return math.sqrt(FLOAT16_TINY / 2)
    return None


OptimizerSpec = SparseSGD | SparseAdagrad | SparseRowWiseAdagrad | SparseAdam
OPTIMIZER_SPECS = (SparseSGD, SparseAdagrad, SparseRowWiseAdagrad, SparseAdam)
