"""The insert rule for one bucket's run of sorted misses, shared by the upsert kernels.

A run is the misses of one bucket, consecutive in the upsert's sorted order. Its
first occurrences are ranked by (score desc, key asc, batch position asc) and
placed by the pinned rule of ``insert/triton.py`` from the bucket as it was before
the call: rank r < n_empty takes the r-th empty slot, and rank n_empty + j evicts
the j-th lowest entry by (score asc, slot asc) when its score is at least that
entry's. Only the program where a run opens writes its bucket.
"""

from __future__ import annotations

import triton
import triton.language as tl

from hashrec.table.ops.insert.triton import bucket_state, write_entries


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
def _chunk_firsts(in_keys, in_scores, in_first, in_pos, c, end, BI: tl.constexpr):
    """Sorted positions [c, c + BI) before ``end``: (first-occurrence mask, keys, scores,
    batch positions), zeros off the mask."""
    j = c + tl.arange(0, BI)
    mj = j < end
    mj = mj & (tl.load(in_first + j, mask=mj, other=-1) == j)
    return (mj, tl.load(in_keys + j, mask=mj, other=0), tl.load(in_scores + j, mask=mj, other=0),
            tl.load(in_pos + j, mask=mj, other=0))


@triton.jit
def _rank_firsts(in_keys, in_scores, in_first, in_pos, pos, key, score, start, end,
                 BI: tl.constexpr):
    """Rank of first occurrences (at batch positions ``pos``) among the run's by
    (score desc, key asc, batch position asc)."""
    rank = tl.zeros([BI], dtype=tl.int32)
    c = start
    while c < end:
        mj, kj, sj, pj = _chunk_firsts(in_keys, in_scores, in_first, in_pos, c, end, BI)
        before = comes_before(kj[None, :], sj[None, :], pj[None, :], key[:, None],
                              score[:, None], pos[:, None])
        rank += tl.sum((before & mj[None, :]).to(tl.int32), axis=1)
        c += BI
    return rank


@triton.jit
def insert_run(in_keys, in_tags, in_scores, in_digests, in_bucket, in_first, in_pos, m,
               t_keys, t_tags, t_digests, t_scores, out_slots, out_evicted, ev_any, ev_keys,
               ev_tags, ev_scores, marks, start, bucket, ALLOW_EVICT: tl.constexpr,
               CAP: tl.constexpr, CAP_P2: tl.constexpr, BI: tl.constexpr):
    """Inserts the run of misses of ``bucket`` that opens at sorted position ``start``
    (``marks``: as ``write_entries``)."""
    i = start + tl.arange(0, BI)
    run = (i < m) & (tl.load(in_bucket + i, mask=i < m, other=-1) == bucket)
    if tl.sum(run.to(tl.int32), axis=0) < BI:  # the whole run is in registers
        mi = run & (tl.load(in_first + i, mask=run, other=-1) == i)
        key = tl.load(in_keys + i, mask=mi, other=0)
        score = tl.load(in_scores + i, mask=mi, other=0)
        pos = tl.load(in_pos + i, mask=mi, other=0)
        before = comes_before(key[None, :], score[None, :], pos[None, :], key[:, None],
                              score[:, None], pos[:, None])
        rank = tl.sum((before & mi[None, :]).to(tl.int32), axis=1)
        empty, empty_rank, n_empty, order, old_scores = bucket_state(
            t_digests, t_scores, bucket * CAP, tl.arange(0, CAP_P2) < CAP,
            tl.sum(mi.to(tl.int32), axis=0), ALLOW_EVICT, CAP_P2)
        _place(i, mi, key, score, rank, bucket * CAP, empty, empty_rank, n_empty, order,
               old_scores, in_tags, in_digests, t_keys, t_tags, t_digests, t_scores,
               out_slots, out_evicted, ev_any, ev_keys, ev_tags, ev_scores, marks, bucket,
               ALLOW_EVICT, CAP_P2)
    else:
        _insert_long_run(in_keys, in_tags, in_scores, in_digests, in_bucket, in_first, in_pos,
                         m, t_keys, t_tags, t_digests, t_scores, out_slots, out_evicted, ev_any,
                         ev_keys, ev_tags, ev_scores, marks, start, bucket, ALLOW_EVICT, CAP,
                         CAP_P2, BI)


@triton.jit
def insert_runs(opens, bucket, first, in_keys, in_tags, in_scores, in_digests, in_bucket,
                in_first, in_pos, m, t_keys, t_tags, t_digests, t_scores, out_slots,
                out_evicted, ev_any, ev_keys, ev_tags, ev_scores, marks,
                ALLOW_EVICT: tl.constexpr, CAP: tl.constexpr, CAP_P2: tl.constexpr,
                BI: tl.constexpr, B: tl.constexpr):
    """Inserts, one after the other, the runs that open at sorted positions ``first`` +
    lane (B lanes) where ``opens``; ``bucket``: each lane's."""
    lane = tl.arange(0, B)
    while tl.max(opens.to(tl.int32), axis=0) > 0:
        r = tl.min(tl.where(opens, lane, B), axis=0)
        insert_run(in_keys, in_tags, in_scores, in_digests, in_bucket, in_first, in_pos, m,
                   t_keys, t_tags, t_digests, t_scores, out_slots, out_evicted, ev_any, ev_keys,
                   ev_tags, ev_scores, marks, first + r,
                   tl.sum(tl.where(lane == r, bucket, 0), axis=0), ALLOW_EVICT, CAP, CAP_P2, BI)
        opens = opens & (lane != r)


@triton.jit
def comes_before(kj, sj, j, key, score, i):
    """Whether incoming j precedes i in the order (score desc, key asc, position asc):
    the same key under two tags ties on score and key, and the batch position orders
    them as the reference insert does."""
    tie = (kj < key) | ((kj == key) & (j < i))
    return (sj > score) | ((sj == score) & tie)


@triton.jit
def _place(i, mi, key, score, rank, base, empty, empty_rank, n_empty, order, old_scores,
           in_tags, in_digests, t_keys, t_tags, t_digests, t_scores, out_slots, out_evicted, ev_any,
           ev_keys, ev_tags, ev_scores, marks, bucket, ALLOW_EVICT: tl.constexpr,
           CAP_P2: tl.constexpr):
    """Slots of the incoming keys ``i`` (where ``mi``) from their ranks, per the rule."""
    col = tl.arange(0, CAP_P2)
    to_empty = empty[None, :] & (empty_rank[None, :] == rank[:, None])
    victim = order[None, :] == (rank - n_empty)[:, None]
    victim = victim & (score[:, None] >= old_scores[None, :]) & (rank >= n_empty)[:, None]
    take = (to_empty | victim) & mi[:, None]
    slot_col = tl.min(tl.where(take, col[None, :], CAP_P2), axis=1)
    ok = mi & (slot_col < CAP_P2)
    slot = base + slot_col
    ev = ok & (tl.max(victim.to(tl.int32), axis=1) > 0)
    write_entries(i, mi, ok, ev, slot, key, score, in_tags, in_digests, t_keys, t_tags,
                  t_digests, t_scores, out_evicted, ev_any, ev_keys, ev_tags, ev_scores, marks,
                  bucket, ALLOW_EVICT)
    tl.store(out_slots + i, tl.where(ok, slot, -1), mask=mi)


@triton.jit
def _insert_long_run(in_keys, in_tags, in_scores, in_digests, in_bucket, in_first, in_pos,
                     m, t_keys,
                     t_tags, t_digests, t_scores, out_slots, out_evicted, ev_any, ev_keys, ev_tags,
                     ev_scores, marks, start, bucket, ALLOW_EVICT: tl.constexpr, CAP: tl.constexpr,
                     CAP_P2: tl.constexpr, BI: tl.constexpr):
    """The insert rule for a run of >= BI misses, chunk by chunk."""
    end = _run_end(in_bucket, start, bucket, m)
    empty, empty_rank, n_empty, order, old_scores = bucket_state(
        t_digests, t_scores, bucket * CAP, tl.arange(0, CAP_P2) < CAP,
        _count_firsts(in_first, start, end, BI), ALLOW_EVICT, CAP_P2)
    c = start
    while c < end:
        i = c + tl.arange(0, BI)
        mi, key, score, pos = _chunk_firsts(in_keys, in_scores, in_first, in_pos, c, end, BI)
        rank = _rank_firsts(in_keys, in_scores, in_first, in_pos, pos, key, score, start, end,
                            BI)
        _place(i, mi, key, score, rank, bucket * CAP, empty, empty_rank, n_empty, order,
               old_scores, in_tags, in_digests, t_keys, t_tags, t_digests, t_scores,
               out_slots, out_evicted, ev_any, ev_keys, ev_tags, ev_scores, marks, bucket,
               ALLOW_EVICT, CAP_P2)
        c += BI
