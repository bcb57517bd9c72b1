"""add_by_tag: per-tag counts of a batch's flagged keys, added on the device.

See ``reference.py`` for shapes and semantics; ``triton.py`` (CUDA) has the same
signature.
"""

from __future__ import annotations

import torch

from hashrec.table.ops.dispatch import backend
from hashrec.table.ops.tag_counts import reference


def add_by_tag(sums: torch.Tensor, tags: torch.Tensor, masks: list[torch.Tensor]) -> None:
    """Adds to ``sums[k, t]`` the keys of tag t that ``masks[k]`` flags (see reference)."""
    backend(__name__, reference, tags.device).add_by_tag(sums, tags, masks)


__all__ = ["add_by_tag"]
