"""Entry identities and row fingerprints for incremental dumps and delta application.

An entry is identified by (key, tag). ``identity_hash`` is the table's own mixed
hash of the pair; lookups search a hash-sorted reference and then compare the
key and tag themselves, so equal hashes of different entries never match.
"""

from __future__ import annotations

import torch

from hashrec.table.hashing import mix64

_TAG_MULT = 0x9E3779B97F4A7C15 - (1 << 64)
_SCORE_MULT = 0xD6E8FEB86659FD93 - (1 << 64)
_FINGERPRINT_SLICE = 1 << 16


def identity_hash(keys: torch.Tensor, tags: torch.Tensor) -> torch.Tensor:
    """(n,) int64 keys and (n,) int32 tags -> (n,) int64 hashes (mix64 of key ^ tag * C)."""
    return mix64(keys ^ (tags.to(torch.int64) * _TAG_MULT))


class IdentityIndex:
    """Sorted (key, tag) reference set that answers exact membership queries.

    Args:
        keys: (n,) int64.
        tags: (n,) int32.
    """

    def __init__(self, keys: torch.Tensor, tags: torch.Tensor) -> None:
        h = identity_hash(keys, tags)
        self.hashes, order = torch.sort(h)
        self.order = order
        self.keys = keys[order]
        self.tags = tags[order]

    def __len__(self) -> int:
        return int(self.hashes.shape[0])

    def find(self, keys: torch.Tensor, tags: torch.Tensor) -> torch.Tensor:
        """(n,) positions into the sorted reference, -1 where (key, tag) is absent."""
        n = len(self)
        out = torch.full(keys.shape, -1, dtype=torch.int64, device=keys.device)
        if n == 0 or keys.numel() == 0:
            return out
        h = identity_hash(keys, tags)
        left = torch.searchsorted(self.hashes, h)
        right = torch.searchsorted(self.hashes, h, right=True)
        single = (right - left) == 1
        pos = left.clamp(max=n - 1)
        exact = single & (self.keys[pos] == keys) & (self.tags[pos] == tags)
        out[exact] = pos[exact]
        # Several entries share a hash (different tags): compare each candidate.
        for i in torch.nonzero((right - left) > 1).flatten().tolist():
            for j in range(int(left[i]), int(right[i])):
                if self.keys[j] == keys[i] and self.tags[j] == tags[i]:
                    out[i] = j
                    break
        return out


def _column_multipliers(width: int, device: torch.device) -> torch.Tensor:
    # Odd multipliers: a change in any single column always changes the sum.
    cols = torch.arange(1, width + 1, dtype=torch.int64, device=device)
    return mix64(cols) | 1


def row_fingerprint(rows: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:
    """64-bit fingerprint of each row's bits and score: (k, w), (k,) -> (k,) int64.

    A linear hash over the raw bit patterns with odd per-column multipliers, then
    mixed; computed in slices so its temporaries stay small.
    """
    if rows.element_size() == 8:
        bits_dtype = torch.int64
    elif rows.element_size() == 4:
        bits_dtype = torch.int32
    else:
        bits_dtype = torch.int16
    width = rows.shape[1]
    mult = _column_multipliers(width, rows.device)
    out = torch.empty(rows.shape[0], dtype=torch.int64, device=rows.device)
    for start in range(0, rows.shape[0], _FINGERPRINT_SLICE):
        part = rows[start:start + _FINGERPRINT_SLICE].contiguous().view(bits_dtype)
        acc = (part.to(torch.int64) * mult).sum(dim=1)
        acc = acc + scores[start:start + _FINGERPRINT_SLICE].to(torch.int64) * _SCORE_MULT
        out[start:start + _FINGERPRINT_SLICE] = mix64(acc)
    return out
