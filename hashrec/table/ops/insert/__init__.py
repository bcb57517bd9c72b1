"""insert_keys: place absent keys in their buckets, evicting per the insert rule."""

from __future__ import annotations

import torch

from hashrec.table.ops.dispatch import backend
from hashrec.table.ops.insert import reference
from hashrec.table.storage import InsertResult, TableStorage


def insert_keys(storage: TableStorage, keys: torch.Tensor, tags: torch.Tensor | None,
                scores: torch.Tensor, allow_evict: bool) -> InsertResult:
    """keys (m,) unique and absent, tags (m,) int32 | None, scores (m,) int64 -> InsertResult.

    Only index fields (keys, tags, digests, scores) are written; the caller
    initializes the new rows' values.
    """
    module = backend(__name__, reference, keys.device)
    return module.insert_keys(storage, keys, tags, scores, allow_evict)
