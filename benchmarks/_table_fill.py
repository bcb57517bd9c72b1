"""Direct fill of a table index for GPU benchmarks (no insert kernel involved)."""

from __future__ import annotations

import torch

from hashrec.table.hashing import bucket_of, digest_of, mix64
from hashrec.table.storage import TableStorage

I64 = torch.iinfo(torch.int64)
CAP = 128


def random_keys(n: int, device: torch.device) -> torch.Tensor:
    return torch.randint(I64.min, I64.max, (n,), dtype=torch.int64, device=device)


def mixed_batch(stored: torch.Tensor, n: int, device: torch.device) -> torch.Tensor:
    """``n`` distinct keys, benchmark A's insert batch: 60% drawn from ``stored`` (present),
    the rest random (new)."""
    hits = int(0.6 * n)
    pick = stored[torch.randperm(stored.numel(), device=device)[:hits]]
    return torch.cat([pick, random_keys(n - hits, device)])


def snapshot(storage: TableStorage) -> list[torch.Tensor]:
    """Copies of an index's keys, tags, digests and scores, for ``restore``."""
    return [t.clone() for t in (storage.keys, storage.tags, storage.digests, storage.scores)]


def restore(storage: TableStorage, saved: list[torch.Tensor]) -> None:
    """Puts a ``snapshot`` back (an insert benchmark's calls each start from one index)."""
    for dst, src in zip((storage.keys, storage.tags, storage.digests, storage.scores), saved):
        dst.copy_(src)


def _rank_in_bucket(buckets: torch.Tensor) -> torch.Tensor:
    """Position of each entry among the equal values of sorted ``buckets``."""
    first = torch.searchsorted(buckets, buckets, right=False)
    return torch.arange(buckets.numel(), device=buckets.device) - first


def filled_index(slots: int, load_factor: float, device: torch.device,
                 cap: int = CAP) -> tuple[TableStorage, torch.Tensor]:
    """A storage of ``slots`` slots (buckets of ``cap``, row_dim 1, scores 0) at about
    ``load_factor``: random keys placed by a bucket sort, lowest free slots first.
    Returns the storage and the stored keys."""
    storage = TableStorage.empty(slots // cap, cap, 1, device=device)
    keys = torch.unique(random_keys(int(slots * load_factor * 1.3) + 16, device))
    keys = keys[torch.randperm(keys.numel(), device=device)]
    h = mix64(keys)
    buckets, order = torch.sort(bucket_of(h, storage.num_buckets), stable=True)
    keys, h = keys[order], h[order]
    keep = _rank_in_bucket(buckets) < cap
    keys, h, buckets = keys[keep], h[keep], buckets[keep]
    pick = torch.randperm(keys.numel(), device=device)[:int(slots * load_factor)]
    pick = pick.sort().values
    keys, h, buckets = keys[pick], h[pick], buckets[pick]
    slot = buckets * cap + _rank_in_bucket(buckets)
    storage.keys[slot] = keys
    storage.digests[slot] = digest_of(h)
    return storage, keys
