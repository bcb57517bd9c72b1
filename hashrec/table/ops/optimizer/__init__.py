"""apply_sparse_update: in-place optimizer step on stored rows (embedding + state)."""

from __future__ import annotations

import torch

from hashrec.table.ops.dispatch import backend
from hashrec.table.ops.optimizer import reference
from hashrec.table.optim import OptimizerSpec


def apply_sparse_update(values: torch.Tensor, slots: torch.Tensor, grads: torch.Tensor,
                        spec: OptimizerSpec, lr: float, step: int) -> None:
    """values (R, row_dim), slots (u,) unique int64, grads (u, dim) float32 -> None.

    ``lr`` overrides the spec's learning rate; ``step`` is the 1-based global step
    (Adam bias correction). Negative slots (keys without a stored row) are skipped.
    """
    module = backend(__name__, reference, values.device)
    module.apply_sparse_update(values, slots, grads, spec, lr, step)
