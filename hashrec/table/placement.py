"""Entries written back into the slots they held: an exact restore of a table's layout.

Where a full bucket evicts among equal scores, the slot breaks the tie (the insert
rule: score, then slot). A restore that places each bucket's entries as inserts do
(highest score first) keeps every entry but may order equal scores otherwise, so that a
resumed run would evict other keys than an uninterrupted one. A checkpoint therefore
saves each entry's slot, and a restore into a storage of the same bucket count and
bucket size puts the entry back there (``place_at``).
"""

from __future__ import annotations

import torch

from hashrec.table.hashing import bucket_of, digest_of, mix_tagged
from hashrec.table.ops.find import find_slots
from hashrec.table.storage import TableStorage


def place_at(storage: TableStorage, keys: torch.Tensor, tags: torch.Tensor | None,
             scores: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
    """Writes the index fields of entries (keys (n,) int64, tags (n,) int32 | None, scores
    (n,) int64) absent from ``storage`` into ``slots`` (n,) int64 where each slot is
    empty, in the entry's bucket and named once; returns (n,) bool, the entries so placed
    (the caller assigns or inserts the others as usual and writes the placed ones' rows).
    """
    capacity = storage.capacity
    h = mix_tagged(keys, tags)
    inside = (slots >= 0) & (slots < capacity)
    at = slots.clamp(0, max(capacity - 1, 0))
    ok = inside & (bucket_of(h, storage.num_buckets) == at // storage.bucket_capacity)
    ok &= (storage.digests[at] == 0) & (find_slots(storage, keys, tags) < 0)
    # a slot named twice keeps neither entry there (the inserts place both)
    chosen = torch.nonzero(ok).flatten()
    if chosen.numel() > 1:
        named, order = torch.sort(at[chosen])
        same = named[1:] == named[:-1]
        twice = torch.zeros_like(named, dtype=torch.bool)
        twice[1:] |= same
        twice[:-1] |= same
        ok[chosen[order[twice]]] = False
    where = at[ok]
    if where.numel():
        storage.note_tags(None if tags is None else tags[ok])
        storage.keys[where] = keys[ok]
        if tags is not None:
            storage.tags[where] = tags[ok]
        storage.scores[where] = scores[ok]
        storage.digests[where] = digest_of(h[ok])
    return ok
