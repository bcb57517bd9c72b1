"""Slot moves of a rehash, for row stores that keep values outside the index."""

from __future__ import annotations

import torch

from hashrec.table.ops.export import occupied_slots
from hashrec.table.ops.find import find_slots
from hashrec.table.storage import TableStorage

MOVE_CHUNK = 1 << 16


def rehash_moves(old: TableStorage, new: TableStorage) -> tuple[torch.Tensor, torch.Tensor]:
    """(old slots (k,), new slots (k,)) of every entry carried from ``old`` to ``new``
    (not those a last growth dropped from crowded buckets)."""
    before = occupied_slots(old, 0, old.capacity)
    after = find_slots(new, old.keys[before], old.tags[before])
    if new.num_buckets % old.num_buckets:
        kept = after >= 0
        before, after = before[kept], after[kept]
    return before, after


def move_rows(read, write, old_slots: torch.Tensor, new_slots: torch.Tensor) -> None:
    """Copies rows in chunks: ``write(new_chunk, read(old_chunk))`` (bounds device memory)."""
    for begin in range(0, old_slots.numel(), MOVE_CHUNK):
        end = begin + MOVE_CHUNK
        write(new_slots[begin:end], read(old_slots[begin:end]))


def stored_only(slots: torch.Tensor, grads: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``slots`` (u,) and ``grads`` (u, dim) without the negative slots (keys not stored)."""
    stored = slots >= 0
    if bool(stored.all()):
        return slots, grads
    return slots[stored], grads[stored]
