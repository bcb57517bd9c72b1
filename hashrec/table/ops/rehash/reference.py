"""Reference rehash: split every bucket over a storage with a multiple of its buckets.

A bucket is bits 0..31 of the entry's hash modulo the bucket count, so with the new
count a multiple of the old one, an entry of old bucket ``b`` goes to a new bucket
congruent to ``b``, and each new bucket receives the entries of one old bucket only:
nothing can overflow and nothing is evicted. Within its new bucket, entries keep
their old order (ascending old slot) and fill the lowest slots.
"""

from __future__ import annotations

import torch

from hashrec.table.hashing import bucket_of, mix_tagged
from hashrec.table.storage import TableStorage

ROW_CHUNK = 1 << 18  # rows moved at a time (a copy of every row at once could exhaust memory)


def check_multiple(storage: TableStorage, num_buckets: int) -> None:
    """Raises ``ValueError`` unless ``num_buckets`` is a positive multiple of the old count."""
    if num_buckets <= 0 or num_buckets % storage.num_buckets:
        raise ValueError(f"rehash to {num_buckets} buckets: the count must be a multiple of "
                         f"the storage's {storage.num_buckets}")


def rehash(storage: TableStorage, num_buckets: int) -> TableStorage:
    """Returns a storage with ``num_buckets`` buckets (a multiple of the old count)
    holding every entry of ``storage``, placed as the module docstring says."""
    check_multiple(storage, num_buckets)
    grown = TableStorage.empty(num_buckets, storage.bucket_capacity, storage.row_dim,
                               storage.values.dtype, storage.device)
    grown.tagged = storage.tagged
    occupied = torch.nonzero(storage.digests).flatten()  # ascending
    keys = storage.keys[occupied]
    tags = storage.tags[occupied] if storage.tagged else None  # else every tag is 0
    targets, order = torch.sort(bucket_of(mix_tagged(keys, tags), num_buckets), stable=True)
    first = torch.searchsorted(targets, targets)  # each target's first position
    rank = torch.arange(targets.numel(), device=targets.device) - first
    slots, moved = targets * storage.bucket_capacity + rank, occupied[order]
    for name in ("keys", "tags", "digests", "scores"):
        getattr(grown, name)[slots] = getattr(storage, name)[moved]
    for begin in range(0, moved.numel(), ROW_CHUNK):  # rows in chunks: bounded memory
        end = begin + ROW_CHUNK
        grown.values[slots[begin:end]] = storage.values[moved[begin:end]]
    return grown
