"""Triton versions of the key mixing in ``hashrec.table.hashing``, bit for bit.

Keys are read as int64 and mixed as uint64 (wrap-around multiply, logical
shifts), so every int64 value, negatives and INT64_MIN/MAX included, hashes the
same here as in the PyTorch reference. The jit helpers are shared by every table
kernel; ``hash_keys`` is a launcher used to bucket keys before an insert.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hashrec.table.ops.launch import cdiv, fast_launch

# Fibonacci multiplier that folds a tag into the key (same constant as hashing.py).
TAG_MULTIPLIER = 0x9E3779B97F4A7C15


@triton.jit
def mix64(x):
    """splitmix64 finalizer on uint64 values."""
    x = x ^ (x >> 30)
    x = x * 0xBF58476D1CE4E5B9
    x = x ^ (x >> 27)
    x = x * 0x94D049BB133111EB
    return x ^ (x >> 31)


@triton.jit
def tagged_hash(key, tag):
    """h = mix64(key ^ tag * TAG_MULTIPLIER) on uint64, from int64 keys and int32 tags."""
    k = key.to(tl.uint64, bitcast=True)
    t = tag.to(tl.int64).to(tl.uint64, bitcast=True)
    return mix64(k ^ (t * 0x9E3779B97F4A7C15))


@triton.jit
def bucket_of(h, num_buckets):
    """Bucket from bits 0..31 of h: int64 in [0, num_buckets)."""
    return (h & 0xFFFFFFFF).to(tl.int64) % num_buckets


@triton.jit
def bucket_of_fast(h, num_buckets, POW2: tl.constexpr):
    """``bucket_of`` with a mask instead of the 64-bit modulo when num_buckets is 2**k."""
    if POW2:
        return (h & 0xFFFFFFFF & (num_buckets - 1)).to(tl.int64)
    return bucket_of(h, num_buckets)


def is_pow2(x: int) -> bool:
    """Whether x is a positive power of two (buckets then come from a bit mask)."""
    return x > 0 and x & (x - 1) == 0


@triton.jit
def digest_of(h):
    """One-byte digest from bits 56..63 of h, in [1, 255], as int32."""
    return (h >> 56).to(tl.int32) % 255 + 1


@triton.jit
def load_tags(tags_ptr, offs, mask, HAS_TAGS: tl.constexpr):
    """Tags at ``offs``, or zeros when the call has no tags."""
    if HAS_TAGS:
        return tl.load(tags_ptr + offs, mask=mask, other=0)
    return tl.zeros(offs.shape, dtype=tl.int32)


# n stays specialized (not on the training path; unspecialized the kernel took 90
# registers against 56: benchmarks/results/specialization_cost.md).
@fast_launch
@triton.jit
def _hash_keys_kernel(keys_ptr, tags_ptr, bucket_ptr, digest_ptr, n, num_buckets,
                      HAS_TAGS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    key = tl.load(keys_ptr + offs, mask=mask, other=0)
    tag = load_tags(tags_ptr, offs, mask, HAS_TAGS)
    h = tagged_hash(key, tag)
    tl.store(bucket_ptr + offs, bucket_of(h, num_buckets), mask=mask)
    tl.store(digest_ptr + offs, digest_of(h).to(tl.uint8), mask=mask)


def check_keys(keys: torch.Tensor, tags: torch.Tensor | None, device: torch.device) -> None:
    """Validates (n,) int64 keys and optional (n,) int32 tags on ``device``."""
    if keys.dtype != torch.int64 or keys.dim() != 1:
        raise ValueError(f"keys must be a 1-D int64 tensor, got {keys.dtype} {tuple(keys.shape)}")
    if keys.device != device:
        raise ValueError(f"keys are on {keys.device}, the table on {device}")
    if tags is not None and (tags.dtype != torch.int32 or tags.shape != keys.shape
                             or tags.device != device):
        raise ValueError(f"tags must be int32 of shape {tuple(keys.shape)} on {device}, "
                         f"got {tags.dtype} {tuple(tags.shape)} on {tags.device}")


def hash_keys(keys: torch.Tensor, tags: torch.Tensor | None,
              num_buckets: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Buckets and digests of keys: (n,) int64 [+ (n,) int32 tags] -> ((n,) int64, (n,) uint8)."""
    check_keys(keys, tags, keys.device)
    keys = keys.contiguous()
    n = keys.numel()
    buckets = torch.empty(n, dtype=torch.int64, device=keys.device)
    digests = torch.empty(n, dtype=torch.uint8, device=keys.device)
    if n:
        block = 1024
        tag_arg = tags.contiguous() if tags is not None else keys
        _hash_keys_kernel[(cdiv(n, block),)](
            keys, tag_arg, buckets, digests, n, num_buckets,
            HAS_TAGS=tags is not None, BLOCK=block)
    return buckets, digests
