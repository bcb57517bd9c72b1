"""Split the rows of a list of pieces among ranks and workers.

Every reader (one DataLoader worker of one rank) is a *slot*; slot
``rank * num_workers + worker`` of ``world_size * num_workers`` reads the
contiguous row range ``[slot * T // S, (slot + 1) * T // S)`` of the pieces laid
end to end (T rows, S slots). Ranges tile the rows exactly, so no row is lost
or read twice, and slots differ by at most one row.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from hashrec.data.sources import Piece


def epoch_order(pieces: Sequence[Piece], shuffle: bool, seed: int, epoch: int) -> list[Piece]:
    """Pieces in reading order: as listed, or permuted by (seed, epoch) when shuffling.

    Every slot computes the same order, so the slots of all ranks still tile it.
    """
    if not shuffle:
        return list(pieces)
    perm = np.random.default_rng([seed, epoch]).permutation(len(pieces))
    return [pieces[i] for i in perm]


def slot_ranges(pieces: Sequence[Piece], slot: int, num_slots: int
                ) -> list[tuple[Piece, int, int]]:
    """The (piece, start, stop) row ranges that slot ``slot`` of ``num_slots`` reads."""
    if not 0 <= slot < num_slots:
        raise ValueError(f"slot must be in [0, {num_slots}), got {slot}")
    total = sum(p.num_rows for p in pieces)
    lo, hi = slot * total // num_slots, (slot + 1) * total // num_slots
    ranges, pos = [], 0
    for piece in pieces:
        start, stop = max(lo, pos), min(hi, pos + piece.num_rows)
        if start < stop:
            ranges.append((piece, start - pos, stop - pos))
        pos += piece.num_rows
        if pos >= hi:
            break
    return ranges
