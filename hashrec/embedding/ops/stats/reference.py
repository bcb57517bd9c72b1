"""Per-table lookup counts in torch operators (the CPU path and the kernel's oracle)."""

from __future__ import annotations

import functools

import torch


def take_unstored_by_tag(sums: torch.Tensor, slots: torch.Tensor, tags: torch.Tensor) -> None:
    """Subtracts from ``sums`` (T,) int64, per tag t, the keys of tag t with a negative slot.

    Args:
        sums: (T,) int64 running counts, updated in place.
        slots: (U,) int64 slots of a storage's unique keys (-1: not stored).
        tags: (U,) int32 table of each key, ascending (a storage's keys come table by
            table), each below T.
    """
    unstored = slots >> 63  # -1 where a key is not stored, else 0: one op, no cast
    # A running sum read at each tag's bounds: adding into T counters instead
    # (``index_add_``) makes every key's atomic wait on its table's.
    bounds = torch.searchsorted(tags, _tag_range(sums.numel(), tags.dtype, tags.device))
    running = torch.zeros(unstored.numel() + 1, dtype=torch.int64, device=unstored.device)
    torch.cumsum(unstored, 0, out=running[1:])
    at = running.index_select(0, bounds)
    sums.add_(at[1:] - at[:-1])


@functools.lru_cache(maxsize=16)
def _tag_range(num_tags: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """0, 1, ..., num_tags: the first position of each tag and the end (searchsorted)."""
    return torch.arange(num_tags + 1, dtype=dtype, device=device)
