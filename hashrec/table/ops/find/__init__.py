"""find_slots: (key, tag) -> slot, -1 when absent."""

from __future__ import annotations

import torch

from hashrec.table.ops.dispatch import backend
from hashrec.table.ops.find import reference
from hashrec.table.storage import TableStorage


def find_slots(storage: TableStorage, keys: torch.Tensor,
               tags: torch.Tensor | None = None) -> torch.Tensor:
    """keys (n,) int64, tags (n,) int32 | None -> slots (n,) int64, -1 when absent."""
    return backend(__name__, reference, keys.device).find_slots(storage, keys, tags)
