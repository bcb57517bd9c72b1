"""Reference insert: sort incoming keys by bucket, fill empty slots, then evict.

Within one bucket the incoming keys are ordered by (score desc, key asc). They
take the bucket's empty slots first (lowest slot first); the i-th remaining one is
then paired with the i-th lowest pre-existing entry, ordered by (score asc, slot
asc), and evicts it iff its score is >= that entry's score; otherwise it is
refused, and so are all later ones (their scores are lower, the entries' higher).
"""

from __future__ import annotations

import torch

from hashrec.table.hashing import bucket_of, digest_of, mix_tagged
from hashrec.table.storage import InsertResult, TableStorage


def _bucket_order(buckets: torch.Tensor, keys: torch.Tensor, scores: torch.Tensor):
    """Permutation sorting incoming keys by (bucket asc, score desc, key asc)."""
    order = torch.argsort(keys, stable=True)
    order = order[torch.sort(scores[order], descending=True, stable=True).indices]
    return order[torch.argsort(buckets[order], stable=True)]


def _existing_by_score(storage: TableStorage, buckets: torch.Tensor):
    """(g, bc) columns of each bucket's occupied slots by (score asc, slot asc), then empties."""
    bc = storage.bucket_capacity
    flat = buckets[:, None] * bc + torch.arange(bc, device=buckets.device)
    cols = torch.sort(storage.scores[flat], dim=1, stable=True).indices
    empty = (storage.digests[flat] == 0).gather(1, cols).to(torch.uint8)
    cols = cols.gather(1, torch.sort(empty, dim=1, stable=True).indices)
    return cols, storage.scores[flat].gather(1, cols)


def insert_keys(storage: TableStorage, keys: torch.Tensor, tags: torch.Tensor | None,
                scores: torch.Tensor, allow_evict: bool) -> InsertResult:
    """keys (m,) unique and absent, tags (m,) int32 | None, scores (m,) int64 -> InsertResult."""
    device = keys.device
    storage.note_tags(tags)
    m = keys.numel()
    if m == 0:
        empty = torch.empty(0, dtype=torch.int64, device=device)
        return InsertResult(empty, empty, empty.to(torch.int32), empty)
    tags = torch.zeros(m, dtype=torch.int32, device=device) if tags is None else tags
    h = mix_tagged(keys, tags)
    bc = storage.bucket_capacity
    buckets = bucket_of(h, storage.num_buckets)
    order = _bucket_order(buckets, keys, scores)
    sorted_buckets = buckets[order]
    groups, counts = torch.unique_consecutive(sorted_buckets, return_counts=True)
    group = torch.repeat_interleave(torch.arange(groups.numel(), device=device), counts)
    rank = torch.arange(m, device=device) - (torch.cumsum(counts, 0) - counts)[group]

    occupied = storage.digests.view(storage.num_buckets, bc).index_select(0, groups) != 0
    free = bc - occupied.sum(1)
    empty_cols = torch.sort(occupied.to(torch.uint8), dim=1, stable=True).indices
    slots = torch.full((m,), -1, dtype=torch.int64, device=device)
    fill = torch.nonzero(rank < free[group]).flatten()
    slots[fill] = groups[group[fill]] * bc + empty_cols[group[fill], rank[fill]]

    evicted = torch.empty(0, dtype=torch.int64, device=device)
    overflow = counts > free
    if allow_evict and bool(overflow.any()):
        hot = torch.nonzero(overflow).flatten()
        position = torch.full((groups.numel(),), -1, dtype=torch.int64, device=device)
        position[hot] = torch.arange(hot.numel(), device=device)
        cols, existing_scores = _existing_by_score(storage, groups[hot])
        rest = torch.nonzero((rank >= free[group]) & (rank - free[group] < bc - free[group]))
        rest = rest.flatten()
        g, j = position[group[rest]], (rank - free[group])[rest]
        wins = scores[order[rest]] >= existing_scores[g, j]
        rest, g, j = rest[wins], g[wins], j[wins]
        evicted = groups[hot[g]] * bc + cols[g, j]
        slots[rest] = evicted

    result = InsertResult(
        slots=torch.empty_like(slots).scatter_(0, order, slots),
        evicted_keys=storage.keys[evicted],
        evicted_tags=storage.tags[evicted],
        evicted_scores=storage.scores[evicted],
    )
    placed = result.slots >= 0
    target = result.slots[placed]
    storage.keys[target] = keys[placed]
    storage.tags[target] = tags[placed]
    storage.digests[target] = digest_of(h[placed])
    storage.scores[target] = scores[placed]
    return result
