"""Reference export scan."""

from __future__ import annotations

import torch

from hashrec.table.storage import TableStorage


def occupied_slots(storage: TableStorage, start: int, end: int) -> torch.Tensor:
    """Slots in [start, end) that are occupied: (k,) int64, ascending."""
    window = storage.digests[start:end]
    return torch.nonzero(window).flatten() + start
