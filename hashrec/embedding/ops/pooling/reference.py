"""Pooling of jagged bags from deduplicated rows, in pure PyTorch.

Shapes: ``rows`` (U, D) are the unique rows a lookup returned; ``inverse`` (n,)
maps each id of the bags to its row; ``offsets`` (B + 1,) delimit the B bags in
``inverse``; ``weights`` (n,) or None scale each id. ``mean`` divides a bag by
its length (weights do not change the divisor, as in TorchRec); an empty bag
pools to zeros.
"""

from __future__ import annotations

import torch


def _bag_index(offsets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    lengths = offsets[1:] - offsets[:-1]
    bags = torch.arange(lengths.numel(), device=offsets.device)
    return torch.repeat_interleave(bags, lengths), lengths


def pool_forward(rows: torch.Tensor, inverse: torch.Tensor, offsets: torch.Tensor | None,
                 weights: torch.Tensor | None, mean: bool, one_id: bool = False) -> torch.Tensor:
    """Pools bags: -> (B, D) float32 sums (or means) of their rows. ``one_id``: every bag
    holds one id (bag b is id b), and ``offsets`` may be None."""
    if offsets is None:
        if not one_id:
            raise ValueError("offsets may be None only with one_id")
        offsets = torch.arange(inverse.numel() + 1, device=inverse.device)
    bag, lengths = _bag_index(offsets)
    picked = rows.index_select(0, inverse).float()
    if weights is not None:
        picked = picked * weights.to(picked.dtype).unsqueeze(1)
    out = torch.zeros(lengths.numel(), rows.shape[1], dtype=torch.float32, device=rows.device)
    out.index_add_(0, bag, picked)
    if mean:
        out = out / lengths.clamp(min=1).to(out.dtype).unsqueeze(1)
    return out


def pool_backward(grad_out: torch.Tensor, inverse: torch.Tensor, offsets: torch.Tensor,
                  weights: torch.Tensor | None, mean: bool, num_rows: int) -> torch.Tensor:
    """Gradient of ``pool_forward`` w.r.t. ``rows``: (B, D) -> (U, D) float32, summed per row."""
    bag, lengths = _bag_index(offsets)
    grad = grad_out.float()
    if mean:
        grad = grad / lengths.clamp(min=1).to(grad.dtype).unsqueeze(1)
    per_id = grad.index_select(0, bag)
    if weights is not None:
        per_id = per_id * weights.to(per_id.dtype).unsqueeze(1)
    out = torch.zeros(num_rows, grad.shape[1], dtype=torch.float32, device=grad.device)
    out.index_add_(0, inverse, per_id)
    return out


def reduce_positions(grads: torch.Tensor, gidx: torch.Tensor, inverse: torch.Tensor,
                     order: torch.Tensor, row_start: torch.Tensor,
                     weights: torch.Tensor | None, groups: list[int] | None = None,
                     sorted_rows: torch.Tensor | None = None, sorted_gidx: bool = False,
                     covered: bool = False) -> torch.Tensor:
    """Sums position gradients per unique row: -> (U, D) float32.

    Position ``p`` contributes ``grads[gidx[p]] * weights[p]`` to row ``inverse[p]``;
    ``order`` / ``row_start`` (the CSR grouping of positions by row, which the
    Triton version walks) only size the output here, and ``groups`` changes
    nothing: every row sums its positions in batch order (``order``'s, with
    ``sorted_gidx``: ``gidx`` and ``weights`` then hold entry q for position
    ``order[q]``, whose row is ``sorted_rows[q]``, or ``inverse[order[q]]``).
    ``covered`` (every row has a position) changes nothing here.
    """
    del groups, covered
    picked = grads.float().index_select(0, gidx)
    if weights is not None:
        picked = picked * weights.to(picked.dtype).unsqueeze(1)
    out = torch.zeros(row_start.numel() - 1, grads.shape[1], dtype=torch.float32,
                      device=grads.device)
    if sorted_gidx:
        rows = sorted_rows if sorted_rows is not None else inverse.index_select(0, order)
        return out.index_add_(0, rows, picked)
    return out.index_add_(0, inverse, picked)
