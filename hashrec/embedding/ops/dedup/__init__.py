"""A storage's dedup ops, dispatched by device: ``padded_keys`` (the one-pass sort keys
of a padded batch) and ``mark_sorted`` (the sorted keys' ids, tags and unique marks)
around the sort; after it ``tag_summary`` (per logical table: unique keys, smallest
and largest id) and ``unique_layout`` (the unique keys and the index maps between them
and the ids).

See ``reference.py`` for shapes and semantics; ``triton.py`` (CUDA) has the same
signature.
"""

from __future__ import annotations

import torch

from hashrec.embedding.ops.dedup import reference
from hashrec.table.ops.dispatch import backend


def tag_summary(sorted_tags: torch.Tensor, sorted_ids: torch.Tensor, group: torch.Tensor,
                num_tags: int, bad: torch.Tensor | None = None,
                starts: torch.Tensor | None = None) -> torch.Tensor:
    """(3, num_tags) int64: unique keys, smallest id, largest id of every tag."""
    impl = backend(__name__, reference, sorted_tags.device)
    return impl.tag_summary(sorted_tags, sorted_ids, group, num_tags, bad, starts)


def unique_layout(group: torch.Tensor, order: torch.Tensor, sorted_ids: torch.Tensor,
                  sorted_tags: torch.Tensor | None, u: int
                  ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """(keys (u,), tags (u,) or None, inverse (n,), row_start (u + 1,))."""
    impl = backend(__name__, reference, group.device)
    return impl.unique_layout(group, order, sorted_ids, sorted_tags, u)


def padded_keys(ids: torch.Tensor, meta: torch.Tensor, num_tags: int, bits: int,
                clamp: bool, compact: bool, features: int | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(one-pass keys (N,) int64, or int32 when ``compact``; 0-d bool: an id too wide).
    ``features``: read the ids from the addresses in ``meta`` (Triton only)."""
    impl = backend(__name__, reference, ids.device)
    return impl.padded_keys(ids, meta, num_tags, bits, clamp, compact, features)


def mark_sorted(keys: torch.Tensor, bits: int, num_tags: int | None = None
                ) -> tuple[torch.Tensor, ...]:
    """(sorted_ids int64, sorted_tags int32, new bool, group int64) of sorted keys (N,),
    and with ``num_tags`` every tag's first position (num_tags + 1,) int64."""
    impl = backend(__name__, reference, keys.device)
    return impl.mark_sorted(keys, bits, num_tags)


__all__ = ["mark_sorted", "padded_keys", "tag_summary", "unique_layout"]
