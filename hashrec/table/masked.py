"""Fixed-size masked writes: ``dst[index[mask]] = values[mask]`` without a host sync.

Boolean-mask indexing sizes its output by the mask, so on CUDA it reads the mask
back on the host and drains the queue. ``masked_assign_`` keeps every tensor at the
batch size instead: entries outside the mask are redirected to one anchor entry
and write the value that entry ends up with, so every write to a position writes
the same value and the result is deterministic.
"""

from __future__ import annotations

import torch


def masked_assign_(dst: torch.Tensor, index: torch.Tensor, mask: torch.Tensor,
                   values: torch.Tensor | int) -> None:
    """dst[index[i]] = values[i] for every i with mask[i], in place, no host sync.

    Args:
        dst: (R,) tensor written in place.
        index: (n,) int64 positions in ``dst``; unique where ``mask`` (any value,
            negative included, elsewhere).
        mask: (n,) bool.
        values: (n,) tensor of ``dst``'s dtype, or one int for every entry.
    """
    n = index.numel()
    if n == 0:
        return
    if not isinstance(values, torch.Tensor):
        values = torch.full((n,), values, dtype=dst.dtype, device=dst.device)
    first = torch.argmax(mask.to(torch.int32)).view(1)  # first True; 0 when none
    anchor = index.index_select(0, first).clamp(min=0)
    any_set = mask.index_select(0, first)
    anchor_value = torch.where(any_set, values.index_select(0, first),
                               dst.index_select(0, anchor))
    dst.scatter_(0, torch.where(mask, index, anchor), torch.where(mask, values, anchor_value))


def gather_or(src: torch.Tensor, index: torch.Tensor, fallback: torch.Tensor | int
              ) -> torch.Tensor:
    """src[index] where index >= 0, else ``fallback``: (n,) -> (n,) (or rows of a matrix)."""
    found = index >= 0
    taken = src.index_select(0, index.clamp(min=0))
    if taken.dim() > 1:
        found = found.view(-1, *([1] * (taken.dim() - 1)))
    # A Python scalar goes to torch.where as is: a tensor made from it on the device
    # would be a host-to-device copy (and a host sync) per call.
    return torch.where(found, taken, fallback)
