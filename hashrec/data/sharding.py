"""Split the rows of a list of pieces among ranks and workers.

Every reader (one DataLoader worker of one rank) is a *slot*; slot
``rank * num_workers + worker`` of ``world_size * num_workers`` reads one
contiguous row range of the pieces laid end to end (T rows, S slots). The ranges
are cut at whole batches (B rows): of the F = T // B full batches, slot s reads
batches ``[s * F // S, (s + 1) * F // S)``, and slot 0 (which has the fewest) also
reads the R = T - F * B rows left over, at its end (so all ranges after it start R
rows later). Ranges tile the rows exactly, so no row is lost or read twice; slots,
and ranks, differ by at most one batch, and only slot 0 ends with a partial batch
(rather than every slot: with 12 workers, 12 ragged steps per epoch).
How many batches each slot yields follows from the row count alone
(``slot_batches``), so a reader knows its peers' counts without reading.
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


def slot_ranges(pieces: Sequence[Piece], slot: int, num_slots: int, batch_size: int = 1
                ) -> list[tuple[Piece, int, int]]:
    """The (piece, start, stop) row ranges that slot ``slot`` of ``num_slots`` reads,
    cut at multiples of ``batch_size`` rows (see the module docstring)."""
    if not 0 <= slot < num_slots:
        raise ValueError(f"slot must be in [0, {num_slots}), got {slot}")
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    total = sum(p.num_rows for p in pieces)
    full = total // batch_size
    rest = total - full * batch_size
    lo = 0 if slot == 0 else slot * full // num_slots * batch_size + rest
    hi = (slot + 1) * full // num_slots * batch_size + rest
    ranges, pos = [], 0
    for piece in pieces:
        start, stop = max(lo, pos), min(hi, pos + piece.num_rows)
        if start < stop:
            ranges.append((piece, start - pos, stop - pos))
        pos += piece.num_rows
        if pos >= hi:
            break
    return ranges


def slot_batches(total_rows: int, slot: int, num_slots: int, batch_size: int,
                 drop_remainder: bool) -> int:
    """Batches slot ``slot`` of ``num_slots`` yields from ``total_rows`` rows cut as
    ``slot_ranges`` cuts them (``drop_remainder``: without slot 0's partial batch)."""
    if not 0 <= slot < num_slots:
        raise ValueError(f"slot must be in [0, {num_slots}), got {slot}")
    full = total_rows // batch_size
    count = (slot + 1) * full // num_slots - slot * full // num_slots
    partial = slot == 0 and total_rows > full * batch_size and not drop_remainder
    return count + int(partial)
