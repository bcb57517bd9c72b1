"""Reference rehash: re-insert every entry into a storage with more buckets."""

from __future__ import annotations

import torch

from hashrec.table.ops.insert.reference import insert_keys
from hashrec.table.storage import TableStorage


def rehash(storage: TableStorage, num_buckets: int) -> TableStorage:
    """Returns a storage with ``num_buckets`` buckets holding every entry of ``storage``.

    With ``num_buckets`` a multiple of the old count, each old bucket splits into
    buckets that receive only its entries, so nothing can overflow. Otherwise an
    entry that does not fit raises ``RuntimeError`` (the caller never asks for that).
    """
    occupied = torch.nonzero(storage.digests).flatten()
    grown = TableStorage.empty(num_buckets, storage.bucket_capacity, storage.row_dim,
                               storage.values.dtype, storage.device)
    tags = storage.tags[occupied] if storage.tagged else None  # else every tag is 0
    result = insert_keys(grown, storage.keys[occupied], tags,
                         storage.scores[occupied], allow_evict=False)
    if bool((result.slots < 0).any()):
        raise RuntimeError(
            f"rehash to {num_buckets} buckets could not place every entry; the bucket count "
            f"must be a multiple of {storage.num_buckets}")
    grown.values[result.slots] = storage.values[occupied]
    return grown
