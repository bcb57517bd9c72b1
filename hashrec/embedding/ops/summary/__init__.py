"""Per logical table of a sorted storage batch: unique keys, smallest and largest id.
``tag_summary`` dispatched by device.

See ``reference.py`` for shapes and semantics; ``triton.py`` (CUDA) has the same
signature.
"""

from __future__ import annotations

import torch

from hashrec.embedding.ops.summary import reference
from hashrec.table.ops.dispatch import backend


def tag_summary(sorted_tags: torch.Tensor, sorted_ids: torch.Tensor, group: torch.Tensor,
                num_tags: int, bad: torch.Tensor | None = None) -> torch.Tensor:
    """(3, num_tags) int64: unique keys, smallest id, largest id of every tag."""
    impl = backend(__name__, reference, sorted_tags.device)
    return impl.tag_summary(sorted_tags, sorted_ids, group, num_tags, bad)


__all__ = ["tag_summary"]
