"""Triton find: digest probe, then key + tag compare, inside the key's bucket only.

One program handles ``BLOCK`` keys. For each it loads the bucket's digests as one
vector (one 128-byte line at the default bucket capacity), compares them with the
key's digest, and then reads stored keys and tags candidate by candidate, only at
digest matches. With a power-of-two bucket count (the usual case: tables grow by
doubling) the bucket is a bit mask of the hash, not a 64-bit modulo. ``find_values`` also gathers the embedding columns
of found rows in the same program, so a lookup is a single launch.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hashrec.table._triton_hash import (
    bucket_of_fast,
    check_keys,
    digest_of,
    is_pow2,
    load_tags,
    tagged_hash,
)
from hashrec.table.storage import TableStorage


@triton.jit
def probe_bucket(key, tag, mask, t_keys, t_tags, t_digests, num_buckets,
                 CAP: tl.constexpr, CAP_P2: tl.constexpr, POW2: tl.constexpr):
    """Slot of each (key, tag) in its bucket, -1 when absent: (BLOCK,) int64.

    The bucket's digest line is loaded as one vector per key; stored keys are then
    read only at digest matches, one candidate per key and round, lowest slot first
    (a key is stored at most once, so the first full match is the answer). A round
    costs one (BLOCK,) gather; about one false digest match per two full buckets.
    """
    h = tagged_hash(key, tag)
    base = bucket_of_fast(h, num_buckets, POW2) * CAP
    dig = digest_of(h)
    col = tl.arange(0, CAP_P2)
    in_bucket = mask[:, None] & (col[None, :] < CAP)
    stored = tl.load(t_digests + base[:, None] + col[None, :], mask=in_bucket, other=0)
    cand = in_bucket & (stored.to(tl.int32) == dig[:, None])
    nxt = tl.min(tl.where(cand, col[None, :], CAP_P2), axis=1)
    found = tl.full(nxt.shape, -1, dtype=tl.int64)
    while tl.min(nxt, axis=0) < CAP_P2:
        live = nxt < CAP_P2
        slot = base + nxt
        hit = live & (tl.load(t_keys + slot, mask=live, other=0) == key)
        hit = hit & (tl.load(t_tags + slot, mask=hit, other=0) == tag)
        found = tl.where(hit, slot, found)
        cand = cand & (col[None, :] > nxt[:, None]) & ~hit[:, None]
        nxt = tl.min(tl.where(cand, col[None, :], CAP_P2), axis=1)
    return found


@triton.jit
def _find_kernel(keys_ptr, tags_ptr, t_keys, t_tags, t_digests, t_values, out_slots,
                 out_values, n, num_buckets, HAS_TAGS: tl.constexpr, WITH_VALUES: tl.constexpr,
                 CAP: tl.constexpr, CAP_P2: tl.constexpr, POW2: tl.constexpr,
                 ROW_DIM: tl.constexpr, DIM: tl.constexpr, DIM_P2: tl.constexpr,
                 BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    key = tl.load(keys_ptr + offs, mask=mask, other=0)
    tag = load_tags(tags_ptr, offs, mask, HAS_TAGS)
    slot = probe_bucket(key, tag, mask, t_keys, t_tags, t_digests, num_buckets, CAP, CAP_P2,
                        POW2)
    tl.store(out_slots + offs, slot, mask=mask)
    if WITH_VALUES:
        col = tl.arange(0, DIM_P2)
        cmask = col[None, :] < DIM
        found = (slot >= 0)[:, None] & cmask
        row = tl.load(t_values + slot[:, None] * ROW_DIM + col[None, :], mask=found, other=0.0)
        tl.store(out_values + offs[:, None] * DIM + col[None, :], row,
                 mask=mask[:, None] & cmask)


# (keys per program, warps) of the find launch; benchmarks may override it.
FIND_CONFIG = {"block": 32, "num_warps": 4}


def _launch(storage: TableStorage, keys: torch.Tensor, tags: torch.Tensor | None,
            dim: int | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    check_keys(keys, tags, storage.device)
    keys = keys.contiguous()
    n = keys.numel()
    slots = torch.empty(n, dtype=torch.int64, device=keys.device)
    values = None
    if dim is not None:
        if not 0 < dim <= storage.row_dim:
            raise ValueError(f"dim={dim} must be in [1, row_dim={storage.row_dim}]")
        values = torch.empty(n, dim, dtype=storage.values.dtype, device=keys.device)
    if n == 0:
        return slots, values
    cap = storage.bucket_capacity
    cap_p2 = triton.next_power_of_2(cap)
    dim_p2 = triton.next_power_of_2(dim or 1)
    block = max(1, min(FIND_CONFIG["block"], 8192 // max(cap_p2, dim_p2)))
    _find_kernel[(triton.cdiv(n, block),)](
        keys, tags.contiguous() if tags is not None else keys, storage.keys, storage.tags,
        storage.digests, storage.values, slots, values if values is not None else slots,
        n, storage.num_buckets, HAS_TAGS=tags is not None, WITH_VALUES=dim is not None,
        CAP=cap, CAP_P2=cap_p2, POW2=is_pow2(storage.num_buckets), ROW_DIM=storage.row_dim,
        DIM=dim or 1, DIM_P2=dim_p2, BLOCK=block, num_warps=FIND_CONFIG["num_warps"])
    return slots, values


def find_slots(storage: TableStorage, keys: torch.Tensor,
               tags: torch.Tensor | None = None) -> torch.Tensor:
    """Slots of keys: (n,) int64 [+ (n,) int32 tags] -> (n,) int64, -1 where absent."""
    return _launch(storage, keys, tags, None)[0]


def find_values(storage: TableStorage, keys: torch.Tensor, tags: torch.Tensor | None = None,
                dim: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Slots and the first ``dim`` value columns of keys in one pass.

    Returns ``(slots (n,) int64 with -1 where absent, values (n, dim))``; rows of
    absent keys are zero. ``dim`` defaults to the full row.
    """
    slots, values = _launch(storage, keys, tags, dim or storage.row_dim)
    return slots, values
