"""Triton insert: deterministic per-bucket slot assignment and eviction.

The incoming keys (unique, absent) are hashed and sorted by bucket with one torch
sort; then one program per touched bucket applies the pinned rule, independent of
thread timing:

1. rank the bucket's incoming keys by (score desc, key asc) with pairwise counts;
2. rank r < n_empty takes the r-th empty slot (lowest slot index first);
3. rank n_empty + j is paired with the j-th lowest pre-existing entry by
   (score asc, slot asc) and evicts it iff its score is >= the entry's score;
   since incoming scores fall and existing scores rise along the pairing, a refusal
   implies refusal of every later key. Keys inserted by this call are never paired.

Only the index columns (keys, tags, digests, scores) are written.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hashrec.table._triton_hash import check_keys, hash_keys
from hashrec.table.ops.launch import fast_launch, next_pow2
from hashrec.table.storage import InsertResult, TableStorage


@triton.jit
def _incoming_rank(in_keys, in_scores, i, key, score, start, end, BI: tl.constexpr):
    """Rank of each incoming key of the chunk among the bucket's by (score desc, key asc,
    position asc)."""
    rank = tl.zeros([BI], dtype=tl.int32)
    c = start
    while c < end:  # while, not range: loop bounds are run-time values
        j = c + tl.arange(0, BI)
        mj = j < end
        kj = tl.load(in_keys + j, mask=mj, other=0)
        sj = tl.load(in_scores + j, mask=mj, other=0)
        # (score desc, key asc, position asc): the same key under two tags (fused
        # tables) ties on score and key, and the position keeps their ranks apart.
        same = (sj[None, :] == score[:, None]) & (kj[None, :] == key[:, None])
        before = (sj[None, :] > score[:, None]) | (
            (sj[None, :] == score[:, None]) & (kj[None, :] < key[:, None])) | (
            same & (j[None, :] < i[:, None]))
        rank += tl.sum((before & mj[None, :]).to(tl.int32), axis=1)
        c += BI
    return rank


@triton.jit
def _victim_order(scores, occupied, n_pairs, CAP_P2: tl.constexpr):
    """Order (0, 1, ...) of the ``n_pairs`` lowest occupied entries by (score asc, slot asc).

    Returns a (CAP_P2,) int32 vector: the pairing position of each slot, -1 for the rest.
    """
    col = tl.arange(0, CAP_P2)
    order = tl.full([CAP_P2], -1, dtype=tl.int32)
    free = occupied
    p = 0
    while p < n_pairs:
        low = tl.min(tl.where(free, scores, 0x7FFFFFFFFFFFFFFF), axis=0)
        pick = tl.min(tl.where(free & (scores == low), col, CAP_P2), axis=0)
        order = tl.where(col == pick, p, order)
        free = free & (col != pick)
        p += 1
    return order


@triton.jit
def bucket_state(t_digests, t_scores, base, in_bucket, n_incoming, ALLOW_EVICT: tl.constexpr,
                 CAP_P2: tl.constexpr):
    """Empty slots, their ranks and count, the victims' pairing order and the scores of
    the bucket at ``base`` for ``n_incoming`` keys (lanes outside ``in_bucket`` ignored)."""
    col = tl.arange(0, CAP_P2)
    empty = in_bucket & (tl.load(t_digests + base + col, mask=in_bucket, other=1) == 0)
    occupied = in_bucket & ~empty
    n_empty = tl.sum(empty.to(tl.int32), axis=0)
    empty_rank = tl.cumsum(empty.to(tl.int32), axis=0) - 1
    n_pairs = tl.minimum(tl.maximum(n_incoming - n_empty, 0),
                         tl.sum(occupied.to(tl.int32), axis=0))
    if not ALLOW_EVICT:
        n_pairs = n_pairs * 0
    # The whole bucket's scores, empty slots' too: a mask alike across the bucket lets a
    # thread's slots load in 16-byte vectors.
    old_scores = tl.load(t_scores + base + col, mask=in_bucket, other=0)
    order = _victim_order(old_scores, occupied, n_pairs, CAP_P2)
    return empty, empty_rank, n_empty, order, old_scores


@triton.jit
def write_entries(i, mi, ok, ev, slot, key, score, in_tags, in_digests, t_keys, t_tags,
                  t_digests, t_scores, out_evicted, ev_any, ev_keys, ev_tags, ev_scores, marks,
                  bucket, ALLOW_EVICT: tl.constexpr):
    """Saves evicted entries (where ``ev``) at incoming index i, then writes the incoming
    keys' index fields into ``slot`` where ``ok``. ``t_tags`` None: the table holds tag 0
    alone (``TableStorage.probe_tags``), so no tag is read or written. ``ev_any`` (a
    pointer to one int32, or None) is set to 1 where an entry is evicted, and ``marks``
    (an int32 per bucket, or None) to -1 at the ``bucket`` of each (the bucket of each
    incoming key, or of all)."""
    if ALLOW_EVICT:
        if ev_any is not None:
            tl.store(ev_any, 1, mask=tl.max(ev.to(tl.int32), axis=0) > 0)
        if marks is not None:
            tl.store(marks + tl.where(ev, bucket, 0), tl.full(ev.shape, -1, tl.int32), mask=ev)
        tl.store(ev_keys + i, tl.load(t_keys + slot, mask=ev, other=0), mask=ev)
        if t_tags is not None:
            tl.store(ev_tags + i, tl.load(t_tags + slot, mask=ev, other=0), mask=ev)
        else:
            tl.store(ev_tags + i, tl.zeros_like(slot).to(tl.int32), mask=ev)
        tl.store(ev_scores + i, tl.load(t_scores + slot, mask=ev, other=0), mask=ev)
        tl.store(out_evicted + i, ev.to(tl.int8), mask=mi)
    tl.store(t_keys + slot, key, mask=ok)
    if t_tags is not None:  # None: the table holds tag 0 alone, and keeps it
        tl.store(t_tags + slot, tl.load(in_tags + i, mask=ok, other=0), mask=ok)
    tl.store(t_scores + slot, score, mask=ok)
    tl.store(t_digests + slot, tl.load(in_digests + i, mask=ok, other=1), mask=ok)


@fast_launch
@triton.jit
def _insert_kernel(in_keys, in_tags, in_scores, in_digests, in_pos, seg_start, seg_bucket,
                   t_keys, t_tags, t_digests, t_scores, out_slots, out_evicted,
                   ev_keys, ev_tags, ev_scores,
                   ALLOW_EVICT: tl.constexpr, CAP: tl.constexpr, CAP_P2: tl.constexpr,
                   BI: tl.constexpr):
    pid = tl.program_id(0)
    start = tl.load(seg_start + pid)
    end = tl.load(seg_start + pid + 1)
    base = tl.load(seg_bucket + pid) * CAP
    col = tl.arange(0, CAP_P2)
    in_bucket = col < CAP
    empty, empty_rank, n_empty, order, old_scores = bucket_state(
        t_digests, t_scores, base, in_bucket, (end - start).to(tl.int32), ALLOW_EVICT, CAP_P2)
    c = start
    while c < end:
        i = c + tl.arange(0, BI)
        mi = i < end
        key = tl.load(in_keys + i, mask=mi, other=0)
        score = tl.load(in_scores + i, mask=mi, other=0)
        rank = _incoming_rank(in_keys, in_scores, i, key, score, start, end, BI)
        to_empty = (empty[None, :] & (empty_rank[None, :] == rank[:, None]))
        victim = order[None, :] == (rank - n_empty)[:, None]
        victim = victim & (score[:, None] >= old_scores[None, :]) & (rank >= n_empty)[:, None]
        take = (to_empty | victim) & mi[:, None]
        slot_col = tl.min(tl.where(take, col[None, :], CAP_P2), axis=1)
        evicts = tl.max(victim.to(tl.int32), axis=1) > 0
        ok = mi & (slot_col < CAP_P2)
        slot = base + slot_col
        pos = tl.load(in_pos + i, mask=mi, other=0)
        write_entries(i, mi, ok, ok & evicts, slot, key, score, in_tags, in_digests, t_keys,
                      t_tags, t_digests, t_scores, out_evicted, None, ev_keys, ev_tags,
                      ev_scores, None, 0, ALLOW_EVICT)
        tl.store(out_slots + pos, tl.where(ok, slot, -1), mask=mi)
        c += BI


def _validate(storage: TableStorage, keys: torch.Tensor, tags: torch.Tensor | None,
              scores: torch.Tensor) -> None:
    check_keys(keys, tags, storage.device)
    if scores.dtype != torch.int64 or scores.shape != keys.shape:
        raise ValueError(f"scores must be int64 of shape {tuple(keys.shape)}, "
                         f"got {scores.dtype} {tuple(scores.shape)}")


def _empty_result(m: int, device: torch.device) -> InsertResult:
    return InsertResult(
        slots=torch.full((m,), -1, dtype=torch.int64, device=device),
        evicted_keys=torch.empty(0, dtype=torch.int64, device=device),
        evicted_tags=torch.empty(0, dtype=torch.int32, device=device),
        evicted_scores=torch.empty(0, dtype=torch.int64, device=device))


def insert_keys(storage: TableStorage, keys: torch.Tensor, tags: torch.Tensor | None,
                scores: torch.Tensor, allow_evict: bool) -> InsertResult:
    """Inserts unique absent keys: (m,) int64 [+ tags], (m,) int64 scores -> InsertResult.

    ``slots`` is -1 for refused keys; evicted entries come back in the order of
    their replacing keys sorted by (bucket, position in the call).
    """
    _validate(storage, keys, tags, scores)
    storage.note_tags(tags)
    m = keys.numel()
    device = storage.device
    result = _empty_result(m, device)
    if m == 0:
        return result
    t_tags = storage.probe_tags(tags)
    tags = tags if tags is not None else torch.zeros(m, dtype=torch.int32, device=device)
    buckets, digests = hash_keys(keys, tags, storage.num_buckets)
    sorted_buckets, perm = torch.sort(buckets, stable=True)
    uniq, counts = torch.unique_consecutive(sorted_buckets, return_counts=True)
    seg_start = torch.zeros(uniq.numel() + 1, dtype=torch.int64, device=device)
    torch.cumsum(counts, 0, out=seg_start[1:])
    evicted = torch.zeros(m, dtype=torch.int8, device=device)
    ev_keys = torch.empty(m, dtype=torch.int64, device=device)
    ev_tags = torch.empty(m, dtype=torch.int32, device=device)
    ev_scores = torch.empty(m, dtype=torch.int64, device=device)
    cap = storage.bucket_capacity
    _insert_kernel[(uniq.numel(),)](
        keys[perm], tags[perm], scores[perm], digests[perm], perm, seg_start, uniq,
        storage.keys, t_tags, storage.digests, storage.scores, result.slots,
        evicted, ev_keys, ev_tags, ev_scores, ALLOW_EVICT=bool(allow_evict),
        CAP=cap, CAP_P2=next_pow2(cap), BI=16, num_warps=4)
    if allow_evict:
        hit = evicted.bool()
        result.evicted_keys = ev_keys[hit]
        result.evicted_tags = ev_tags[hit]
        result.evicted_scores = ev_scores[hit]
    return result
