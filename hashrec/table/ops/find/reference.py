"""Reference lookup: compare digests over each key's bucket window, then confirm keys.

A key's bucket window is one row of ``digests.view(num_buckets, bucket_capacity)``;
the one-byte digest filters out ~254/255 of the occupied slots before the full
(key, tag) comparison. Keys are processed in chunks to bound the window memory.
"""

from __future__ import annotations

import torch

from hashrec.table.hashing import bucket_of, digest_of, mix_tagged
from hashrec.table.storage import TableStorage

_CHUNK = 32768


def find_slots(storage: TableStorage, keys: torch.Tensor,
               tags: torch.Tensor | None = None) -> torch.Tensor:
    """keys (n,) int64, tags (n,) int32 | None -> slots (n,) int64, -1 when absent."""
    n = keys.numel()
    out = torch.full((n,), -1, dtype=torch.int64, device=keys.device)
    if n == 0:
        return out
    h = mix_tagged(keys, tags)
    buckets = bucket_of(h, storage.num_buckets)
    digests = digest_of(h)
    bc = storage.bucket_capacity
    windows = storage.digests.view(storage.num_buckets, bc)
    for start in range(0, n, _CHUNK):
        b = buckets[start:start + _CHUNK]
        match = windows.index_select(0, b) == digests[start:start + _CHUNK, None]
        rows, cols = torch.nonzero(match, as_tuple=True)
        slots = b[rows] * bc + cols
        rows += start
        same = storage.keys[slots] == keys[rows]
        stored_tags = storage.tags[slots]
        same &= (stored_tags == 0) if tags is None else (stored_tags == tags[rows])
        out[rows[same]] = slots[same]
    return out
