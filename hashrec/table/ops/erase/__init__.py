"""erase_slots: mark slots empty."""

from __future__ import annotations

import torch

from hashrec.table.ops.dispatch import backend
from hashrec.table.ops.erase import reference
from hashrec.table.storage import TableStorage


def erase_slots(storage: TableStorage, slots: torch.Tensor) -> None:
    """slots (k,) int64 -> None; their digests become 0."""
    backend(__name__, reference, slots.device).erase_slots(storage, slots)
