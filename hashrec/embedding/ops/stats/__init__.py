"""Per-table lookup counts of a storage: ``take_unstored_by_tag`` dispatched by device.

See ``reference.py`` for shapes and semantics; ``triton.py`` (CUDA) has the same
signature.
"""

from __future__ import annotations

import torch

from hashrec.embedding.ops.stats import reference
from hashrec.table.ops.dispatch import backend


def take_unstored_by_tag(sums: torch.Tensor, slots: torch.Tensor, tags: torch.Tensor) -> None:
    """Subtracts from ``sums[t]`` the keys of tag t whose slot is negative (not stored)."""
    impl = backend(__name__, reference, slots.device)
    impl.take_unstored_by_tag(sums, slots, tags)


__all__ = ["take_unstored_by_tag"]
