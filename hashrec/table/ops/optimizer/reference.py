"""Reference sparse optimizer math on rows ``[embedding (dim) | state]``.

Computed in float32 and written back in the storage dtype. SGD and Adagrad match
torch.optim (Adagrad with sparse gradients); row-wise Adagrad feeds the accumulator the
mean of the squared gradient; Adam is dynamicemb's and FBGEMM TBE's (global step bias
correction, eps after it, decoupled weight decay; ``SparseAdam``'s docstring).
"""

from __future__ import annotations

import torch

from hashrec.table.optim import (
    OptimizerSpec,
    SparseAdagrad,
    SparseAdam,
    SparseRowWiseAdagrad,
    SparseSGD,
)


def _adam(rows: torch.Tensor, g: torch.Tensor, spec: SparseAdam, lr: float, step: int) -> None:
    dim = g.shape[1]
    w, m, v = rows[:, :dim], rows[:, dim:2 * dim], rows[:, 2 * dim:3 * dim]
    m.mul_(spec.beta1).add_(g, alpha=1.0 - spec.beta1)
    v.mul_(spec.beta2).addcmul_(g, g, value=1.0 - spec.beta2)
    # m_hat / (sqrt(v_hat) + eps) as the Triton kernel computes it, one rounding an
    # operation in the same order, so that half-precision rows round alike on both paths.
    scale, eps = spec.folded_corrections(step)
    update = (m * scale).div_(v.sqrt().add_(eps))
    if spec.weight_decay:
        update.add_(w * spec.weight_decay)  # of the weight before this update
    w.sub_(update.mul_(lr))


def apply_sparse_update(values: torch.Tensor, slots: torch.Tensor, grads: torch.Tensor,
                        spec: OptimizerSpec, lr: float, step: int) -> None:
    """values (R, row_dim), slots (u,) unique int64, grads (u, dim) float32 -> None (in place).

    Args:
        values: the storage's rows; updated in place at ``slots``.
        slots: unique row indices; negative entries (keys without a stored row) are
            skipped with their gradient rows.
        grads: gradient of each row's embedding.
        spec: optimizer spec (decides the state layout).
        lr: learning rate of this step.
        step: 1-based global step (Adam bias correction).
    """
    stored = slots >= 0
    if not bool(stored.all()):
        slots, grads = slots[stored], grads[stored]
    if slots.numel() == 0:
        return
    dim = grads.shape[1]
    rows = values[slots].to(torch.float32)
    g = grads.to(torch.float32)
    w = rows[:, :dim]
    if isinstance(spec, SparseSGD):
        w.add_(g, alpha=-lr)
    elif isinstance(spec, SparseAdagrad):
        acc = rows[:, dim:2 * dim]
        acc.addcmul_(g, g)
        w.addcdiv_(g, acc.sqrt().add_(spec.eps), value=-lr)
    elif isinstance(spec, SparseRowWiseAdagrad):
        acc = rows[:, dim:dim + 1]
        acc.add_(g.pow(2).mean(dim=1, keepdim=True))
        w.addcdiv_(g, acc.sqrt().add_(spec.eps), value=-lr)
    elif isinstance(spec, SparseAdam):
        _adam(rows, g, spec, lr, step)
    else:
        raise TypeError(f"unknown optimizer spec {spec!r}")
    values[slots] = rows.to(values.dtype)
