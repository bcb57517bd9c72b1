"""Pareto-efficient loss weights of a multi-task model (``model_config.use_pareto_loss_weight``).

As TorchEasyRec weighs its task losses (after PE-LTR: Lin et al., "A Pareto-Efficient
Algorithm for Multiple Objective Optimization in E-Commerce Recommendation", RecSys 2019):
every training step, before the backward, each loss L_k's gradient g_k on the dense
parameters is taken, and the weights w solve

    min_w || sum_k w_k g_k ||^2   subject to   sum_k w_k = 1,  w_k >= c_k

(c_k the least weight of the loss: its tower's ``pareto_min_loss_weight``; the c_k sum to
below 1) in two stages. First without the bounds, in closed form: w0 = A^-1 1 / (1^T A^-1 1),
A = G G^T the gradients' Gram matrix (the point of least norm on the plane sum w = 1).
Then the bounds: w = c + the Euclidean projection of w0 - c onto {x >= 0, sum x = 1 - sum c}.
For two losses this is the exact minimum: the least-norm point of the segment between the
two gradients, w_1 = (g_2 - g_1).g_2 / |g_1 - g_2|^2, clipped to [c_1, 1 - c_2]. The step
trains on sum_k w_k L_k, the weights held constant (no gradient flows through them); the
weights sum to 1, so the loss a multi-task model reports while training is this weighted mean,
not the sum of its losses.

A loss whose gradient is 0 (a tower of weight 0, a task whose rows in the batch all weigh 0)
makes the least norm 0 by taking every weight the others' least weights leave: that is the
minimum, and what the least weights are for.

Which gradients count: every dense parameter's (a tower's own included, as TorchEasyRec takes
every trainable parameter: they add to the Gram matrix's diagonal alone). The embedding
tables' rows do not: the fused sparse optimizer updates them inside the backward, once a step,
from the weighted loss (a per-loss backward through them would update them per loss).

How the trainer's step keeps working:

* Every loss's gradient is one more backward pass of the dense network (``autograd.grad``
  with the graph retained), so a step costs that many more backward passes of it, and holds
  one flattened copy of the dense gradients per loss while it solves. A step
  whose dense network replays a CUDA graph (``hashrec.train.graphs``) replays its captured
  forward and backward once per loss and once more for the step's backward (a captured
  backward runs once per forward replay: its capture reuses the activations' memory; the
  forward replays again on the same inputs and random state, so each gives the same
  values); the weights are solved in tensor ops on the device, with no host reads, so
  nothing opts out of graph capture and the host still runs ahead.
* FP16: the gradients are those of the grad scaler's scaled losses (the weights do not change
  when every gradient is scaled alike, so they are not unscaled). A Gram matrix that is not
  finite (an overflow of the scaled gradients) gives the weights of orthonormal gradients
  instead of NaN; the scaler then judges the step by the weighted loss's gradients.
* Gradient clipping and the dense optimizers act on the weighted loss's gradients, as without
  Pareto weights.
* Several ranks: each rank solves on its own batch's gradients, before the dense gradients are
  averaged, as TorchEasyRec's per-task gradients are taken (no exchange of gradients per loss);
  the weighted losses' dense gradients are then averaged over the ranks as usual.
* Deterministic: fixed-order reductions (float32 dot products of the flattened gradients, the
  solve in float64), no atomics and no random choices.

The solved weights are shown in the progress line (``loss weights (binary_cross_entropy_ctr
0.41234, ...)``, their mean over the line's steps and ranks) and written to TensorBoard as
``loss_weight/<loss>``.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

# The ridge added to the Gram matrix, relative to its mean diagonal: gradients that are
# parallel (or zero) make it singular, and the ridge picks the solution nearest to equal
# weights there, where any split of the weight gives the same norm; it also outweighs the
# float32 dot products' rounding, which could make a nearly singular matrix indefinite.
RIDGE = 1e-6


def project_to_simplex(values: torch.Tensor, total) -> torch.Tensor:
    """The Euclidean projection of ``values`` (K,) onto {x : x >= 0, sum x = total}
    (``total`` > 0, a number or a scalar tensor): x = max(values - theta, 0), theta the
    largest of (the sum of the k largest values - total) / k over k. Sorts; no host reads.

    Example::

        project_to_simplex(torch.tensor([0.3, 0.2]), 1.0)   # tensor([0.55, 0.45])
    """
    ordered = torch.sort(values, descending=True).values
    counts = torch.arange(1, values.numel() + 1, dtype=values.dtype, device=values.device)
    theta = ((torch.cumsum(ordered, 0) - total) / counts).max()
    return (values - theta).clamp_min(0)


def solve_spd(matrix: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    """x of ``matrix`` x = ``rhs`` for a symmetric positive definite (K, K) ``matrix`` and
    (K,) ``rhs``, by Gauss-Jordan elimination (whose pivots are positive for such a matrix,
    so it needs no pivoting), in K steps of tensor ops: no host reads, the same on every
    device."""
    a, b = matrix, rhs
    eye = torch.eye(a.shape[0], dtype=a.dtype, device=a.device)
    for i in range(a.shape[0]):
        factors = a[:, i] / a[i, i] * (1 - eye[i])  # every row but the pivot's
        a = a - factors[:, None] * a[i]
        b = b - factors * b[i]
    return b / torch.diagonal(a)


def pareto_weights(gram: torch.Tensor, min_weights: torch.Tensor) -> torch.Tensor:
    """The Pareto-efficient weights (K,) float32 of losses whose gradients have the Gram
    matrix ``gram`` (K, K) (entry i, j: g_i . g_j), each at least its ``min_weights`` (K,)
    entry (the entries >= 0, summing to below 1); see the module docstring. The weights sum
    to 1. Solved in float64 on ``gram``'s device, without host reads.
    """
    a = gram.to(torch.float64)
    least = min_weights.to(device=a.device, dtype=torch.float64)
    eye = torch.eye(a.shape[0], dtype=a.dtype, device=a.device)
    a = torch.where(torch.isfinite(a).all(), a, eye)
    # The weights do not change when every gradient is scaled alike: scale the mean squared
    # norm to 1, which keeps the elimination's numbers near 1 and the ridge relative.
    scale = torch.diagonal(a).mean()
    a = torch.where(scale > 0, a / scale, a) + RIDGE * eye
    ones = torch.ones_like(least)
    inverse_ones = solve_spd(a, ones)
    unbounded = inverse_ones / inverse_ones.sum()
    # never NaN weights (a pivot lost to rounding): those of orthonormal gradients instead
    unbounded = torch.where(torch.isfinite(unbounded).all(), unbounded, ones / ones.numel())
    weights = least + project_to_simplex(unbounded - least, 1 - least.sum())
    return weights.to(torch.float32)


def gram_matrix(rows: torch.Tensor) -> torch.Tensor:
    """(K, P) gradients, a row per loss -> their (K, K) Gram matrix, from float32 dot
    products (not a matrix product, which TF32 may round)."""
    count = rows.shape[0]
    dots = {(i, j): torch.dot(rows[i], rows[j]) for i in range(count) for j in range(i, count)}
    return torch.stack([torch.stack([dots[min(i, j), max(i, j)] for j in range(count)])
                        for i in range(count)])


class ParetoLossWeights:
    """Weighs a training step's losses by their Pareto-efficient weights (see the module
    docstring).

    Args:
        names: the loss keys, in the model's order (``RankModel.losses``).
        min_weights: each loss's least weight (``RankModel.pareto_min_weights``).
        parameters: the dense parameters whose gradients count.
        scale: maps a loss to the one the backward takes (the FP16 grad scaler's ``scale``);
            None takes the loss itself.
    """

    def __init__(self, names: Sequence[str], min_weights: Sequence[float],
                 parameters: Sequence[torch.nn.Parameter],
                 scale: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        self.names = tuple(names)
        if len(min_weights) != len(self.names):
            raise ValueError(f"ParetoLossWeights: {len(min_weights)} least weights for "
                             f"{len(self.names)} losses; expected one per loss")
        self.parameters = [p for p in parameters if p.requires_grad]
        # on the parameters' device from the start: a step copies nothing from the host
        device = self.parameters[0].device if self.parameters else None
        self.min_weights = torch.tensor(tuple(min_weights), dtype=torch.float64,
                                        device=device)
        self.scale = scale

    def gradients(self, values: Sequence[torch.Tensor],
                  again: Callable[[], Sequence[torch.Tensor]] | None = None) -> torch.Tensor:
        """(K, P) float32: row k the flattened gradient of ``values[k]`` (scaled by
        ``scale``) on the parameters, in order (zeros where a loss does not reach one).
        The graph is retained for the step's backward; the embedding tables' backward does
        not run. ``again``: the losses from a new forward, for each backward after the first
        (a replayed CUDA graph's backward runs once per forward replay)."""
        params = self.parameters
        device = values[0].device
        rows = torch.empty(len(values), sum(p.numel() for p in params), dtype=torch.float32,
                           device=device)
        for k in range(len(values)):
            if not params:
                break
            if again is not None and k > 0:
                values = again()
            loss = values[k]
            target = loss if self.scale is None else self.scale(loss)
            grads = torch.autograd.grad(target, params, retain_graph=True, allow_unused=True)
            # copied at once: a replayed CUDA graph's gradients are its buffers, which the
            # next loss's replay overwrites
            torch.cat([(g if g is not None else torch.zeros_like(p)).reshape(-1).float()
                       for g, p in zip(grads, params)], out=rows[k])
        return rows

    def weights(self, values: Sequence[torch.Tensor],
                again: Callable[[], Sequence[torch.Tensor]] | None = None) -> torch.Tensor:
        """The (K,) float32 weights of the losses ``values`` (in ``names`` order); ``again``
        as for ``gradients``."""
        rows = self.gradients(values, again)
        if self.min_weights.device != rows.device:  # once: no host-to-device copy a step
            self.min_weights = self.min_weights.to(rows.device)
        return pareto_weights(gram_matrix(rows), self.min_weights)

    def weigh(self, losses: dict[str, torch.Tensor],
              again: Callable[[], dict[str, torch.Tensor]] | None = None
              ) -> tuple[torch.Tensor, torch.Tensor]:
        """(the weighted loss sum_k w_k L_k, the weights w (K,) float32, detached) of the
        step's ``losses`` (by key, every one of ``names``). ``again``: the same losses
        from a new forward, taken before each backward after the first (a replayed CUDA
        graph's, ``DenseGraphs.replay_again``); the weighted loss is then of the last."""
        values = [losses[name] for name in self.names]

        def fresh() -> list[torch.Tensor]:
            replayed = again()
            return [replayed[name] for name in self.names]

        weights = self.weights(values, None if again is None else fresh)
        if again is not None:
            values = fresh()
        stacked = torch.stack([value.float() for value in values])
        return (stacked * weights).sum(), weights
