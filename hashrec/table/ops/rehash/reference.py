"""Reference rehash: move every entry into a storage with more buckets.

A bucket is bits 0..31 of the entry's hash modulo the bucket count. Where the new count
is a multiple of the old one, an entry of old bucket ``b`` goes to a new bucket
congruent to ``b``, and each new bucket receives the entries of one old bucket only:
nothing can overflow (a split). Otherwise (a table's last growth, to a max_capacity
whose bucket count is no multiple) new buckets receive entries of several old ones; a
bucket that receives more than it has slots keeps its highest-scored entries (the
lowest old slot first among equal scores) and the rest are dropped, as inserts at
max_capacity evict, except that entries of ``PROTECTED`` score (an insert's hits and
placed keys) are never dropped: where they alone overflow a bucket the rehash raises
``RehashOverflow`` and the table grows otherwise. Within its new bucket, the entries
kept keep their old order (ascending old slot) and fill the lowest slots.
"""

from __future__ import annotations

import torch

from hashrec.table.hashing import bucket_of, mix_tagged
from hashrec.table.storage import PROTECTED, TableStorage

ROW_CHUNK = 1 << 18  # rows moved at a time (a copy of every row at once could exhaust memory)


class RehashOverflow(ValueError):
    """A rehash to a bucket count that is no multiple would drop a ``PROTECTED`` entry."""


def check_growth(storage: TableStorage, num_buckets: int) -> None:
    """Raises ``ValueError`` where ``num_buckets`` is less than the storage's count."""
    if num_buckets < storage.num_buckets:
        raise ValueError(f"rehash to {num_buckets} buckets: a growth needs at least the "
                         f"storage's {storage.num_buckets}")


def rehash(storage: TableStorage, num_buckets: int) -> TableStorage:
    """Returns a storage with ``num_buckets`` buckets (at least the old count) holding
    the entries of ``storage``, placed as the module docstring says."""
    check_growth(storage, num_buckets)
    grown = TableStorage.empty(num_buckets, storage.bucket_capacity, storage.row_dim,
                               storage.values.dtype, storage.device)
    grown.tagged = storage.tagged
    occupied = torch.nonzero(storage.digests).flatten()  # ascending
    keys = storage.keys[occupied]
    tags = storage.tags[occupied] if storage.tagged else None  # else every tag is 0
    buckets = bucket_of(mix_tagged(keys, tags), num_buckets)
    if num_buckets % storage.num_buckets:
        occupied, buckets = _fitting(storage, occupied, buckets)
    targets, order = torch.sort(buckets, stable=True)
    first = torch.searchsorted(targets, targets)  # each target's first position
    rank = torch.arange(targets.numel(), device=targets.device) - first
    slots, moved = targets * storage.bucket_capacity + rank, occupied[order]
    for name in ("keys", "tags", "digests", "scores"):
        getattr(grown, name)[slots] = getattr(storage, name)[moved]
    for begin in range(0, moved.numel(), ROW_CHUNK):  # rows in chunks: bounded memory
        end = begin + ROW_CHUNK
        grown.values[slots[begin:end]] = storage.values[moved[begin:end]]
    return grown


def _fitting(storage: TableStorage, occupied: torch.Tensor,
             buckets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(occupied, buckets) of the entries each new bucket keeps: all where no bucket gets
    more than its slots, else each bucket's highest scores, lowest old slot first.

    Raises:
        RehashOverflow: ``PROTECTED`` entries alone overflow a new bucket.
    """
    cap = storage.bucket_capacity
    counts = torch.bincount(buckets)
    if counts.numel() == 0 or int(counts.max()) <= cap:
        return occupied, buckets
    protected = torch.bincount(buckets[storage.scores[occupied] == PROTECTED])
    if protected.numel() and int(protected.max()) > cap:
        raise RehashOverflow(f"{int(protected.max())} entries an insert holds would share "
                             f"a bucket of {cap} slots")
    # by bucket, then score descending, then old slot (the order ``occupied`` has)
    by_score = torch.sort(storage.scores[occupied], descending=True, stable=True).indices
    order = by_score[torch.sort(buckets[by_score], stable=True).indices]
    sorted_buckets = buckets[order]
    rank = (torch.arange(order.numel(), device=order.device)
            - torch.searchsorted(sorted_buckets, sorted_buckets))
    kept = torch.sort(order[rank < cap]).values  # back to ascending old slot
    return occupied[kept], buckets[kept]
