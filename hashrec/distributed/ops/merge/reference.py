"""PyTorch reference of the merge op (CPU path and oracle of the Triton kernel)."""

from __future__ import annotations

import torch


def pair_runs(keys: torch.Tensor, tags: torch.Tensor | None
              ) -> tuple[torch.Tensor, torch.Tensor]:
    """(order (m,): positions sorted by (key, tag), stable; starts (m,) bool: where a
    new (key, tag) begins in that order)."""
    if tags is None:
        order = torch.sort(keys, stable=True).indices
    else:
        by_tag = torch.sort(tags, stable=True).indices
        order = by_tag[torch.sort(keys[by_tag], stable=True).indices]
    sorted_keys = keys[order]
    starts = torch.ones_like(sorted_keys, dtype=torch.bool)
    torch.ne(sorted_keys[1:], sorted_keys[:-1], out=starts[1:])
    if tags is not None:
        sorted_tags = tags[order]
        starts[1:] |= sorted_tags[1:] != sorted_tags[:-1]
    return order, starts


def first_occurrences(keys: torch.Tensor, tags: torch.Tensor | None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
    """Each (key, tag)'s first position, in sizes known on the host.

    Args:
        keys: (m,) int64.
        tags: (m,) int32 or None.

    Returns:
        rep (m,) int64: the position of the first occurrence of each position's
        (key, tag); active (m,) bool: ``rep == arange(m)``, one per distinct pair.
    """
    m = keys.numel()
    positions = torch.arange(m, device=keys.device)
    if m == 0:
        return positions, positions.bool()
    order, starts = pair_runs(keys, tags)
    # Stable sorts keep each run in position order: its first element comes first.
    start = torch.cummax(torch.where(starts, positions, 0), 0).values
    rep = torch.empty_like(order).scatter_(0, order, order[start])
    return rep, rep == positions


def first_in_runs(keys: torch.Tensor, tags: torch.Tensor | None, runs: list[int],
                  bounds: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`first_occurrences` of keys that arrive as sorted runs.

    Args:
        keys: (m,) int64, the concatenation of ``len(runs)`` runs of ``runs[i]`` keys,
            each run sorted by (tag, key) and free of repeats (the Triton kernel
            relies on it; this reference does not).
        tags: (m,) int32 or None.
        runs: the runs' lengths (host ints).
        bounds: their starts on the device, or None (unused here).

    Returns:
        rep (m,) int64, active (m,) bool, as :func:`first_occurrences` returns them.
    """
    return first_occurrences(keys, tags)
