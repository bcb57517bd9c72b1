"""occupied_slots: the occupied slots of a slot range, ascending."""

from __future__ import annotations

import torch

from hashrec.table.ops.dispatch import backend
from hashrec.table.ops.export import reference
from hashrec.table.storage import TableStorage


def occupied_slots(storage: TableStorage, start: int, end: int) -> torch.Tensor:
    """Slots in [start, end) that are occupied: (k,) int64, ascending."""
    return backend(__name__, reference, storage.device).occupied_slots(storage, start, end)
