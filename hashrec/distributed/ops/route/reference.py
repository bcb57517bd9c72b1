"""PyTorch reference of the routing op (CPU path and oracle of the Triton kernels)."""

from __future__ import annotations

import torch

from hashrec.table.hashing import owner_of


def route_columns(keys: torch.Tensor, extras: list[torch.Tensor], world_size: int,
                  send_counts: bool = True
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """Keys and their per-key integers, grouped by owning rank.

    Args:
        keys: (n,) int64.
        extras: at most 3 tensors (n,) of integers (tags, counts, scores), sent with
            their keys.
        world_size: ranks the keys are sharded over.
        send_counts: whether to count the keys per owner (callers that know the
            counts on the host skip it).

    Returns:
        order (n,) int64: the permutation that sorts the keys by owner, stable;
        columns (n, 1 + len(extras)) int64: ``stack([keys] + extras, 1)[order]``;
        send_counts (world_size,) int64: the keys each rank owns (None when not asked).
    """
    owners = owner_of(keys, world_size)
    order = torch.sort(owners, stable=True).indices
    columns = torch.stack([keys] + [c.to(torch.int64) for c in extras], 1)[order]
    return order, columns, torch.bincount(owners, minlength=world_size) if send_counts else None


def owner_counts(keys: torch.Tensor, mask: torch.Tensor, world_size: int) -> torch.Tensor:
    """(world_size,) int64: how many of the keys where ``mask`` (n,) bool holds each rank
    owns."""
    return torch.zeros(world_size, dtype=torch.int64, device=keys.device).index_add_(
        0, owner_of(keys, world_size), mask.to(torch.int64))
