"""Triton upsert: find every key, insert the misses, with one host sync in all.

``upsert_slots`` is the write path of ``find_or_insert`` / ``insert_or_assign`` on
CUDA. Unlike ``insert_keys`` it takes any batch (keys present or absent, repeated
or not) and needs no deduplication or bucket bookkeeping from the caller:

1. ``find_slots`` over the whole batch;
2. the misses are compacted (the one sync: its count sizes the next launches);
3. each miss gets a 64-bit sort key ``bucket << (64 - b) | hash >> b`` and one
   stable sort groups the misses by bucket (equal keys end up in one run of equal
   sort keys, so a short backward scan names each repeat's first occurrence);
4. one program per sorted miss; the program that starts a bucket's run applies the
   pinned insert rule (``insert/triton.py``) to the run's first occurrences;
5. repeats take their first occurrence's slot.

The insert is independent of thread timing: a bucket is written by one program,
and all orders are fixed by the data. Evicted entries come back as (m,) arrays
over the sorted misses with a mask, so no further sync is needed.
"""

from __future__ import annotations

from typing import NamedTuple

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
from hashrec.table.ops.find.triton import find_slots
from hashrec.table.ops.insert.triton import bucket_state, write_entries
from hashrec.table.storage import TableStorage


class UpsertResult(NamedTuple):
    """Outcome of ``upsert_slots`` for a batch of n keys (m of them missing).

    Attributes:
        slots: (n,) int64 slot of every key after the call, -1 when refused (or,
            for a key that was present, when a miss of the same call evicted it).
        inserted: (n,) bool, True at the first occurrence of each key placed by this
            call (its row needs initializing); repeats and present keys are False.
        evicted: (m,) bool mask over the ``evicted_*`` arrays.
        evicted_keys: (m,) int64, evicted_tags (m,) int32, evicted_scores (m,) int64.
    """

    slots: torch.Tensor
    inserted: torch.Tensor
    evicted: torch.Tensor
    evicted_keys: torch.Tensor
    evicted_tags: torch.Tensor
    evicted_scores: torch.Tensor


@triton.jit
def _sort_key_kernel(keys_ptr, tags_ptr, miss_ptr, sort_ptr, bucket_ptr, digest_ptr, m,
                     num_buckets, SHIFT: tl.constexpr, HAS_TAGS: tl.constexpr,
                     POW2: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < m
    pos = tl.load(miss_ptr + offs, mask=mask, other=0)
    key = tl.load(keys_ptr + pos, mask=mask, other=0)
    tag = load_tags(tags_ptr, pos, mask, HAS_TAGS)
    h = tagged_hash(key, tag)
    bucket = bucket_of_fast(h, num_buckets, POW2)
    s = (bucket.to(tl.uint64) << (64 - SHIFT)) | (h >> SHIFT)
    s = (s ^ 0x8000000000000000).to(tl.int64, bitcast=True)  # unsigned order as signed
    tl.store(sort_ptr + offs, s, mask=mask)
    tl.store(bucket_ptr + offs, bucket, mask=mask)
    tl.store(digest_ptr + offs, digest_of(h).to(tl.uint8), mask=mask)


@triton.jit
def _first_kernel(sort_ptr, keys_ptr, tags_ptr, first_ptr, m, BLOCK: tl.constexpr):
    """Index of each sorted miss's first occurrence among equal (key, tag)."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = i < m
    s = tl.load(sort_ptr + i, mask=mask, other=0)
    key = tl.load(keys_ptr + i, mask=mask, other=0)
    tag = tl.load(tags_ptr + i, mask=mask, other=0)
    first = i
    q = i - 1
    live = mask & (q >= 0)
    live = live & (tl.load(sort_ptr + q, mask=live, other=0) == s)
    while tl.max(live.to(tl.int32), axis=0) > 0:
        same = live & (tl.load(keys_ptr + q, mask=live, other=0) == key)
        same = same & (tl.load(tags_ptr + q, mask=live, other=0) == tag)
        first = tl.where(same, q, first)
        q = q - 1
        live = live & (q >= 0)
        live = live & (tl.load(sort_ptr + q, mask=live, other=0) == s)
    tl.store(first_ptr + i, first, mask=mask)


@triton.jit
def _run_end(bucket_ptr, p, bucket, m):
    """End (exclusive) of the run of equal buckets that starts at p."""
    end = p + 1
    go = end < m
    while go:
        same = tl.load(bucket_ptr + end) == bucket
        end = tl.where(same, end + 1, end)
        go = same & (end < m)
    return end


@triton.jit
def _count_firsts(in_first, start, end, BI: tl.constexpr):
    """Number of first occurrences in the run [start, end)."""
    count = tl.sum(tl.zeros([BI], dtype=tl.int32), axis=0)
    c = start
    while c < end:
        j = c + tl.arange(0, BI)
        mj = j < end
        count += tl.sum((mj & (tl.load(in_first + j, mask=mj, other=-1) == j)).to(tl.int32),
                        axis=0)
        c += BI
    return count


@triton.jit
def _rank_firsts(in_keys, in_scores, in_first, i, key, score, start, end, BI: tl.constexpr):
    """Rank of first occurrences i among the run's by (score desc, key asc, index asc)."""
    rank = tl.zeros([BI], dtype=tl.int32)
    c = start
    while c < end:
        j = c + tl.arange(0, BI)
        mj = j < end
        mj = mj & (tl.load(in_first + j, mask=mj, other=-1) == j)
        kj = tl.load(in_keys + j, mask=mj, other=0)
        sj = tl.load(in_scores + j, mask=mj, other=0)
        tie = (kj[None, :] < key[:, None]) | ((kj[None, :] == key[:, None])
                                              & (j[None, :] < i[:, None]))
        before = (sj[None, :] > score[:, None]) | ((sj[None, :] == score[:, None]) & tie)
        rank += tl.sum((before & mj[None, :]).to(tl.int32), axis=1)
        c += BI
    return rank


@triton.jit
def _upsert_kernel(in_keys, in_tags, in_scores, in_digests, in_bucket, in_first, m,
                   t_keys, t_tags, t_digests, t_scores, out_slots, out_evicted,
                   ev_keys, ev_tags, ev_scores, ALLOW_EVICT: tl.constexpr, CAP: tl.constexpr,
                   CAP_P2: tl.constexpr, BI: tl.constexpr):
    start = tl.program_id(0).to(tl.int64)
    bucket = tl.load(in_bucket + start)
    opens = tl.load(in_bucket + start - 1, mask=start > 0, other=-1) != bucket
    end = start
    if opens:
        end = _run_end(in_bucket, start, bucket, m)
    base = bucket * CAP
    col = tl.arange(0, CAP_P2)
    in_bucket_col = (col < CAP) & opens
    empty, empty_rank, n_empty, order, old_scores = bucket_state(
        t_digests, t_scores, base, in_bucket_col, _count_firsts(in_first, start, end, BI),
        ALLOW_EVICT, CAP_P2)
    c = start
    while c < end:
        i = c + tl.arange(0, BI)
        mi = i < end
        mi = mi & (tl.load(in_first + i, mask=mi, other=-1) == i)
        key = tl.load(in_keys + i, mask=mi, other=0)
        score = tl.load(in_scores + i, mask=mi, other=0)
        rank = _rank_firsts(in_keys, in_scores, in_first, i, key, score, start, end, BI)
        to_empty = empty[None, :] & (empty_rank[None, :] == rank[:, None])
        victim = order[None, :] == (rank - n_empty)[:, None]
        victim = victim & (score[:, None] >= old_scores[None, :]) & (rank >= n_empty)[:, None]
        take = (to_empty | victim) & mi[:, None]
        slot_col = tl.min(tl.where(take, col[None, :], CAP_P2), axis=1)
        ok = mi & (slot_col < CAP_P2)
        slot = base + slot_col
        ev = ok & (tl.max(victim.to(tl.int32), axis=1) > 0)
        write_entries(i, mi, ok, ev, slot, key, score, in_tags, in_digests, t_keys, t_tags,
                      t_digests, t_scores, out_evicted, ev_keys, ev_tags, ev_scores,
                      ALLOW_EVICT)
        tl.store(out_slots + i, tl.where(ok, slot, -1), mask=mi)
        c += BI


def _launch_insert(storage: TableStorage, keys: torch.Tensor, tags: torch.Tensor | None,
                   scores: torch.Tensor, miss: torch.Tensor, allow_evict: bool):
    """Sorts the misses by bucket and inserts them; -> (sorted slots, first, perm, ev...)."""
    m, device, nb = miss.numel(), storage.device, storage.num_buckets
    sort_key = torch.empty(m, dtype=torch.int64, device=device)
    buckets = torch.empty(m, dtype=torch.int64, device=device)
    digests = torch.empty(m, dtype=torch.uint8, device=device)
    _sort_key_kernel[(triton.cdiv(m, 1024),)](
        keys, tags if tags is not None else keys, miss, sort_key, buckets, digests, m, nb,
        SHIFT=max(1, (nb - 1).bit_length()), HAS_TAGS=tags is not None, POW2=is_pow2(nb),
        BLOCK=1024)
    sort_key, perm = torch.sort(sort_key, stable=True)
    pos = miss[perm]
    s_keys, s_scores = keys[pos], scores[pos]
    s_tags = (tags[pos] if tags is not None
              else torch.zeros(m, dtype=torch.int32, device=device))
    first = torch.empty(m, dtype=torch.int64, device=device)
    _first_kernel[(triton.cdiv(m, 512),)](sort_key, s_keys, s_tags, first, m, BLOCK=512)
    out = torch.full((m,), -1, dtype=torch.int64, device=device)
    evicted = torch.zeros(m, dtype=torch.int8, device=device)
    ev = (torch.empty(m, dtype=torch.int64, device=device),
          torch.empty(m, dtype=torch.int32, device=device),
          torch.empty(m, dtype=torch.int64, device=device))
    cap = storage.bucket_capacity
    _upsert_kernel[(m,)](
        s_keys, s_tags, s_scores, digests[perm], buckets[perm], first, m, storage.keys,
        storage.tags, storage.digests, storage.scores, out, evicted, *ev,
        ALLOW_EVICT=bool(allow_evict), CAP=cap, CAP_P2=triton.next_power_of_2(cap), BI=16,
        num_warps=4)
    return out, first, pos, evicted.bool(), ev


def upsert_slots(storage: TableStorage, keys: torch.Tensor, tags: torch.Tensor | None,
                 scores: torch.Tensor, allow_evict: bool) -> UpsertResult:
    """Finds keys (n,) int64 [+ tags] and inserts the missing ones with ``scores`` (n,).

    Repeated keys are inserted once, with the score of their first occurrence.
    Only index fields are written; rows flagged ``inserted`` need initializing
    (``write_rows``). Returns ``UpsertResult``.
    """
    check_keys(keys, tags, storage.device)
    if scores.dtype != torch.int64 or scores.shape != keys.shape:
        raise ValueError(f"scores must be int64 of shape {tuple(keys.shape)}, "
                         f"got {scores.dtype} {tuple(scores.shape)}")
    keys, scores = keys.contiguous(), scores.contiguous()
    tags = tags.contiguous() if tags is not None else None
    slots = find_slots(storage, keys, tags)
    inserted = torch.zeros(keys.numel(), dtype=torch.bool, device=storage.device)
    miss = torch.nonzero(slots < 0).flatten()
    if miss.numel() == 0:
        empty = torch.empty(0, dtype=torch.int64, device=storage.device)
        return UpsertResult(slots, inserted, empty.bool(), empty, empty.int(), empty)
    out, first, pos, evicted, ev = _launch_insert(storage, keys, tags, scores, miss,
                                                  allow_evict)
    placed = out >= 0
    inserted.scatter_(0, pos, placed)
    slots.scatter_(0, pos, out[first])
    if allow_evict:  # a present key of this batch may have been evicted by a miss
        at = slots.clamp(min=0)
        kept = storage.keys[at] == keys
        if tags is not None:
            kept &= storage.tags[at] == tags
        slots = torch.where(kept, slots, -1)
    return UpsertResult(slots, inserted, evicted, *ev)


@triton.jit
def _write_rows_kernel(values, slots_ptr, mask_ptr, src_ptr, n, ROW_DIM: tl.constexpr,
                       ROW_P2: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    rmask = rows < n
    slot = tl.load(slots_ptr + rows, mask=rmask, other=-1)
    rmask = rmask & (slot >= 0) & (tl.load(mask_ptr + rows, mask=rmask, other=0) != 0)
    col = tl.arange(0, ROW_P2)
    m2 = rmask[:, None] & (col[None, :] < ROW_DIM)
    x = tl.load(src_ptr + rows[:, None] * ROW_DIM + col[None, :], mask=m2, other=0.0)
    tl.store(values + slot[:, None] * ROW_DIM + col[None, :], x, mask=m2)


def write_rows(values: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor,
               rows: torch.Tensor) -> None:
    """values[slots[i]] = rows[i] where mask[i] and slots[i] >= 0, in one launch.

    values (R, row_dim), slots (n,) int64, mask (n,) bool, rows (n, row_dim). With
    repeated slots among the written ones, which row lands is not specified: pass
    a mask that selects each slot once (``UpsertResult.inserted`` does).
    """
    n, row_dim = slots.numel(), values.shape[1]
    if rows.shape != (n, row_dim) or not values.is_contiguous():
        raise ValueError(f"rows must be ({n}, {row_dim}) and values contiguous, got rows "
                         f"{tuple(rows.shape)}")
    if n == 0:
        return
    row_p2 = triton.next_power_of_2(row_dim)
    block = max(1, min(128, 4096 // row_p2))
    _write_rows_kernel[(triton.cdiv(n, block),)](
        values, slots.contiguous(), mask.contiguous().view(torch.uint8),
        rows.to(values.dtype).contiguous(), n, ROW_DIM=row_dim, ROW_P2=row_p2, BLOCK=block)
