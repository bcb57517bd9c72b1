"""Triton sparse optimizer: one pass reads a row [embedding | state], updates both.

``update_rows`` is the shared jit body; the embedding backward kernels call it
right after reducing gradients per unique key, so gradients never go back to
memory between the reduction and the update. Math (fp32, stored back in the
table dtype):

* SGD:      ``w -= lr * g``
* Adagrad:  ``s += g * g; w -= lr * g / (sqrt(s) + eps)``
* RowWise:  ``s += mean(g * g); w -= lr * g / (sqrt(s) + eps)``
* Adam:     ``m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2;
  w -= lr * (m_hat / (sqrt(v_hat) + eps) + wd * w)`` with ``m_hat = m / (1 - b1^t)``,
  ``v_hat = v / (1 - b2^t)`` and the global step t (dynamicemb's and FBGEMM TBE's form:
  eps after the bias correction, weight decay decoupled). The kernel folds both
  corrections into ``adam_scale`` and the eps it is given (``SparseAdam.folded_corrections``).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
import triton.language as tl

from hashrec.table.ops.launch import cdiv, fast_launch, next_pow2
from hashrec.table.ops.tiles import load_rows
from hashrec.table.optim import SparseAdagrad, SparseAdam, SparseRowWiseAdagrad, SparseSGD

OPT_SGD, OPT_ADAGRAD, OPT_ROWWISE, OPT_ADAM = 0, 1, 2, 3


@dataclass(frozen=True)
class KernelHyper:
    """Scalars one optimizer launch needs (bias corrections folded in on the host)."""

    kind: int
    lr: float
    eps: float = 0.0  # Adam: eps * sqrt(1 - beta2 ** step), eps folded onto sqrt(v)
    beta1: float = 0.0
    beta2: float = 0.0
    weight_decay: float = 0.0
    adam_scale: float = 0.0  # sqrt(1 - beta2 ** step) / (1 - beta1 ** step)


def kernel_hyper(spec, lr: float | None, step: int) -> KernelHyper:
    """Folds an optimizer spec, an lr override and the 1-based step into kernel scalars."""
    lr = float(spec.lr if lr is None else lr)
    if isinstance(spec, SparseSGD):
        return KernelHyper(OPT_SGD, lr)
    if isinstance(spec, SparseRowWiseAdagrad):
        return KernelHyper(OPT_ROWWISE, lr, eps=spec.eps)
    if isinstance(spec, SparseAdagrad):
        return KernelHyper(OPT_ADAGRAD, lr, eps=spec.eps)
    if isinstance(spec, SparseAdam):
        if step < 1:
            raise ValueError(f"step={step} is not valid for Adam; allowed: >= 1 (1-based)")
        adam_scale, eps = spec.folded_corrections(step)
        return KernelHyper(OPT_ADAM, lr, eps, spec.beta1, spec.beta2, spec.weight_decay,
                           adam_scale)
    raise ValueError(f"optimizer spec {spec!r} is not supported; allowed: SparseSGD, "
                     "SparseAdagrad, SparseRowWiseAdagrad, SparseAdam")


@triton.jit
def update_rows(t_values, slot, rmask, g, row_dim, dim, lr, eps, beta1, beta2, wd,
                adam_scale, OPT: tl.constexpr, DIM_P2: tl.constexpr, EVEN: tl.constexpr = False):
    """Applies one optimizer step to rows ``slot`` (R,) given fp32 grads g (R, DIM_P2).

    EVEN: ``dim`` is the constexpr DIM_P2, and rows are read as whole vectors
    (``load_rows``)."""
    col = tl.arange(0, DIM_P2)
    cmask = col[None, :] < dim
    m2 = rmask[:, None] & cmask
    base = t_values + slot[:, None] * row_dim
    w_raw = load_rows(t_values, slot, row_dim, col, rmask, cmask, EVEN)
    w = w_raw.to(tl.float32)
    if OPT == 0:
        w = w - lr * g
    elif OPT == 1:
        s = load_rows(t_values + dim, slot, row_dim, col, rmask, cmask, EVEN).to(tl.float32)
        s = s + g * g
        tl.store(base + dim + col[None, :], s.to(w_raw.dtype), mask=m2)
        w = w - lr * g / (tl.sqrt(s) + eps)
    elif OPT == 2:
        sp = t_values + slot * row_dim + dim
        s = tl.load(sp, mask=rmask, other=0.0).to(tl.float32) + tl.sum(g * g, axis=1) / dim
        tl.store(sp, s.to(w_raw.dtype), mask=rmask)
        w = w - lr * g / (tl.sqrt(s)[:, None] + eps)
    else:
        m = load_rows(t_values + dim, slot, row_dim, col, rmask, cmask, EVEN).to(tl.float32)
        v = load_rows(t_values + 2 * dim, slot, row_dim, col, rmask, cmask, EVEN).to(tl.float32)
        m = beta1 * m + (1.0 - beta1) * g
        v = beta2 * v + (1.0 - beta2) * g * g
        tl.store(base + dim + col[None, :], m.to(w_raw.dtype), mask=m2)
        tl.store(base + 2 * dim + col[None, :], v.to(w_raw.dtype), mask=m2)
        # The reference's operations in its order (float16 rows round alike); w on the
        # right is the weight before this update (decoupled weight decay).
        w = w - lr * (adam_scale * m / (tl.sqrt(v) + eps) + wd * w)
    tl.store(base + col[None, :], w.to(w_raw.dtype), mask=m2)


@fast_launch
@triton.jit(do_not_specialize=["u"])
def _apply_kernel(t_values, slots_ptr, grads_ptr, u, row_dim, dim, lr, eps, beta1, beta2, wd,
                  adam_scale, OPT: tl.constexpr, DIM_P2: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    slot = tl.load(slots_ptr + rows, mask=rows < u, other=-1)
    rmask = (rows < u) & (slot >= 0)  # a negative slot has no stored row: no update
    col = tl.arange(0, DIM_P2)
    g = tl.load(grads_ptr + rows[:, None] * dim + col[None, :],
                mask=rmask[:, None] & (col[None, :] < dim), other=0.0).to(tl.float32)
    update_rows(t_values, slot, rmask, g, row_dim, dim, lr, eps, beta1, beta2, wd, adam_scale,
                OPT, DIM_P2)


def rows_per_program(dim_p2: int) -> int:
    """Rows per program so that one tile holds about 2048 elements."""
    return max(1, min(64, 2048 // dim_p2))


# The update launch: {"rows": rows a program (a power of two), "num_warps"}; None keeps
# the default (about 2048 elements a program, 4 warps). Benchmarks may set it.
APPLY_CONFIG: dict | None = None


def apply_sparse_update(values: torch.Tensor, slots: torch.Tensor, grads: torch.Tensor, spec,
                        lr: float | None, step: int) -> None:
    """In-place update of rows ``slots`` (u,) unique with grads (u, dim) float32.

    Negative slots (keys without a stored row) are skipped in the kernel, so the
    caller need not filter them (no host read).
    """
    if slots.dtype != torch.int64 or slots.dim() != 1:
        raise ValueError(f"slots must be a 1-D int64 tensor, got {slots.dtype}")
    if grads.dim() != 2 or grads.shape[0] != slots.numel() or grads.device != values.device:
        raise ValueError(f"grads must be ({slots.numel()}, dim) on {values.device}, "
                         f"got {tuple(grads.shape)} on {grads.device}")
    dim = grads.shape[1]
    if dim + spec.state_dim(dim) != values.shape[1]:
        raise ValueError(f"row_dim {values.shape[1]} != dim {dim} + state "
                         f"{spec.state_dim(dim)} of {type(spec).__name__}")
    hp = kernel_hyper(spec, lr, step)
    u = slots.numel()
    if u == 0:
        return
    dim_p2 = next_pow2(dim)
    config = APPLY_CONFIG or {"rows": rows_per_program(dim_p2), "num_warps": 4}
    block = config["rows"]
    _apply_kernel[(cdiv(u, block),)](
        values, slots.contiguous(), grads.contiguous().float(), u, values.shape[1], dim,
        hp.lr, hp.eps, hp.beta1, hp.beta2, hp.weight_decay, hp.adam_scale,
        OPT=hp.kind, DIM_P2=dim_p2, BLOCK=block, num_warps=config["num_warps"])
