"""Reference erase: clearing the digest frees the slot; keys and values stay as garbage."""

from __future__ import annotations

import torch

from hashrec.table.storage import TableStorage


def erase_slots(storage: TableStorage, slots: torch.Tensor) -> None:
    """slots (k,) int64 -> None (digests := 0); negative entries are skipped."""
    storage.digests[slots[slots >= 0]] = 0
