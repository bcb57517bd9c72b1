"""Per-tag counts of flagged keys in torch operators (the CPU path and the kernel's oracle)."""

from __future__ import annotations

import torch


def add_by_tag(sums: torch.Tensor, tags: torch.Tensor, masks: list[torch.Tensor]) -> None:
    """Adds to ``sums[k, t]``, per tag t, the keys of tag t that ``masks[k]`` flags.

    Args:
        sums: (K, T + 1) int64 running counts, updated in place; column T takes the keys
            whose tag is not in [0, T).
        tags: (n,) int32 tag of each key, in any order.
        masks: K (n,) bool masks.
    """
    check_by_tag_args(sums, tags, masks)
    if not tags.numel():
        return
    last = sums.shape[1] - 1
    column = torch.where((tags >= 0) & (tags < last), tags, last).to(torch.int64)
    sums.index_add_(1, column, torch.stack(masks).to(torch.int64))


def check_by_tag_args(sums: torch.Tensor, tags: torch.Tensor,
                      masks: list[torch.Tensor]) -> None:
    """The shapes the kernel relies on; a mismatch is a caller's bug."""
    if sums.dtype != torch.int64 or sums.dim() != 2 or sums.shape[0] != len(masks) \
            or sums.shape[1] < 1 or not sums.is_contiguous():
        raise ValueError(f"sums must be a contiguous (K, T + 1) int64 array for K={len(masks)} "
                         f"masks, got {sums.dtype} {tuple(sums.shape)}")
    if not 1 <= len(masks) <= 2 or any(m.dtype != torch.bool or m.shape != tags.shape
                                       for m in masks):
        raise ValueError(f"masks must be 1 or 2 bool arrays shaped like tags "
                         f"{tuple(tags.shape)}, got "
                         f"{[(m.dtype, tuple(m.shape)) for m in masks]}")
