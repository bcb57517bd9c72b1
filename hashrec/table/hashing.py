"""64-bit key mixing shared by every table op and by row-wise sharding.

A key's 64-bit mix ``h = mix64(key)`` is cut into independent bit fields:

* bits 0..31  -> bucket: ``(h & 0xFFFFFFFF) % num_buckets``
* bits 32..62 -> owner rank: ``((h >> 32) & 0x7FFFFFFF) % world_size``
* bits 56..63 -> digest: ``(h >> 56) % 255 + 1``, a one-byte filter in [1, 255];
  digest 0 marks an empty slot, so occupancy lives outside the key space and
  every int64 value is a legal key.

The Triton kernels compute the same functions on uint64; both must agree bit
for bit (tests hold them to it).
"""

from __future__ import annotations

import torch

# splitmix64 finalizer constants, written as signed int64 so torch keeps int64.
_M1 = 0xBF58476D1CE4E5B9 - (1 << 64)
_M2 = 0x94D049BB133111EB - (1 << 64)
_LOW31 = (1 << 31) - 1
_LOW32 = (1 << 32) - 1


def _shr(x: torch.Tensor, n: int) -> torch.Tensor:
    """Logical right shift of int64 bit patterns."""
    return (x >> n) & ((1 << (64 - n)) - 1)


def mix64(keys: torch.Tensor) -> torch.Tensor:
    """splitmix64 finalizer: keys (n,) int64 -> mixed bit patterns (n,) int64."""
    x = keys.to(torch.int64)
    x = (x ^ _shr(x, 30)) * _M1
    x = (x ^ _shr(x, 27)) * _M2
    return x ^ _shr(x, 31)


def bucket_of(h: torch.Tensor, num_buckets: int) -> torch.Tensor:
    """Bucket index from a mixed hash: (n,) int64 -> (n,) int64 in [0, num_buckets)."""
    return (h & _LOW32) % num_buckets


def digest_of(h: torch.Tensor) -> torch.Tensor:
    """One-byte digest in [1, 255] from a mixed hash: (n,) int64 -> (n,) uint8."""
    return (_shr(h, 56) % 255 + 1).to(torch.uint8)


def owner_of(keys: torch.Tensor, world_size: int) -> torch.Tensor:
    """Rank that owns each key under row-wise sharding: (n,) int64 -> (n,) int64."""
    if world_size == 1:
        return torch.zeros_like(keys, dtype=torch.int64)
    return (_shr(mix64(keys), 32) & _LOW31) % world_size


# Golden-ratio constant that separates the key spaces of fused tables (signed int64).
_TAG_MULT = 0x9E3779B97F4A7C15 - (1 << 64)


def mix_tagged(keys: torch.Tensor, tags: torch.Tensor | None = None) -> torch.Tensor:
    """Hash of an entry's identity (key, tag): (n,) int64 [+ (n,) int32] -> (n,) int64.

    ``h = mix64(key ^ (tag * 0x9E3779B97F4A7C15))``; tag 0 (or None) gives ``mix64(key)``.
    """
    if tags is None:
        return mix64(keys)
    return mix64(keys ^ (tags.to(torch.int64) * _TAG_MULT))
