"""The upsert's sorted misses with their fields (steps 2 and 3 of ``upsert.py``).

After the sort groups the misses by bucket, the insert kernels read each sorted miss's
key, tag, score, digest and bucket from arrays in sorted order, and the sorted place of
its key's first occurrence (repeats of a key are placed once). ``gather_kernel`` fills
them from a sort's permutation (torch's sort, or the counting sort of every key);
``rank_gather_kernel`` fills them as the counting sort ranks the misses
(``group.segment_rank``), where the call works on its misses alone: one kernel fewer.
``sort_misses`` runs the sort and the gather that fits it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hashrec.table._triton_hash import (
    bucket_of_fast,
    digest_of,
    is_pow2,
    load_tags,
    tagged_hash,
)
from hashrec.table.ops.insert.group import (
    GROUP_LAUNCH,
    group_by_bucket,
    misses_of,
    place_by_bucket,
    segment_rank,
)
from hashrec.table.ops.launch import cdiv, fast_launch

__all__ = ["gather_kernel", "rank_gather_kernel", "sort_misses"]


@triton.jit
def _same_key(keys_ptr, tags_ptr, at, key, tag, check, HAS_TAGS: tl.constexpr):
    """Where ``check``: the batch holds (key, tag) at position ``at``."""
    same = check & (tl.load(keys_ptr + at, mask=check, other=0) == key)
    return same & (load_tags(tags_ptr, at, check, HAS_TAGS) == tag)


@triton.jit
def _gather_fields(at, pos, miss, store, keys_ptr, tags_ptr, scores_ptr, s_keys, s_tags,
                   s_scores, s_digests, s_bucket, num_buckets, HAS_TAGS: tl.constexpr,
                   POW2: tl.constexpr):
    """The fields of the misses at batch positions ``pos`` into sorted places ``at``
    (written where ``store``; bucket -1 where not ``miss``); returns (key, tag)."""
    key = tl.load(keys_ptr + pos, mask=miss, other=0)
    tag = load_tags(tags_ptr, pos, miss, HAS_TAGS)
    h = tagged_hash(key, tag)
    tl.store(s_keys + at, key, mask=store)
    tl.store(s_tags + at, tag, mask=store)
    tl.store(s_scores + at, tl.load(scores_ptr + pos, mask=miss, other=0), mask=store)
    tl.store(s_digests + at, digest_of(h).to(tl.uint8), mask=store)
    tl.store(s_bucket + at, tl.where(miss, bucket_of_fast(h, num_buckets, POW2), -1),
             mask=store)
    return key, tag


@fast_launch
@triton.jit
def gather_kernel(sorted_ptr, perm_ptr, keys_ptr, tags_ptr, scores_ptr, s_keys, s_tags,
                  s_scores, s_digests, s_bucket, first_ptr, ev_any, refused_ptr, n,
                  num_buckets, HAS_TAGS: tl.constexpr, POW2: tl.constexpr,
                  SENTINEL: tl.constexpr, BLOCK: tl.constexpr):
    """Sorted misses' fields, bucket -1 at the hits (after the misses), and the index of
    each sorted miss's first occurrence among equal (key, tag): a backward scan over the
    run of equal sort keys before it, reading the batch through the permutation (such
    a run holds repeats of one key, or rarely keys of equal hash bits). Program 0 also
    clears ``ev_any`` (2,) int32, whose first word the insert kernels after it set when
    they evict and whose second the lane form counts its flagged blocks in, and the
    refused count, which the finalize kernel adds to. (A call on the misses alone gathers
    them in ``rank_gather_kernel`` instead.)"""
    if tl.program_id(0) == 0:
        tl.store(ev_any, 0)
        tl.store(ev_any + 1, 0)
        tl.store(refused_ptr, 0)
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    s = tl.load(sorted_ptr + i, mask=mask, other=SENTINEL)
    miss = mask & (s != SENTINEL)
    pos = tl.load(perm_ptr + i, mask=miss, other=0)
    key, tag = _gather_fields(i, pos, miss, mask, keys_ptr, tags_ptr, scores_ptr, s_keys,
                              s_tags, s_scores, s_digests, s_bucket, num_buckets, HAS_TAGS,
                              POW2)
    first = i
    q = i - 1
    live = miss & (q >= 0)
    live = live & (tl.load(sorted_ptr + q, mask=live, other=0) == s)
    while tl.max(live.to(tl.int32), axis=0) > 0:
        at = tl.load(perm_ptr + q, mask=live, other=0)
        first = tl.where(_same_key(keys_ptr, tags_ptr, at, key, tag, live, HAS_TAGS), q, first)
        q = q - 1
        live = live & (q >= 0)
        live = live & (tl.load(sorted_ptr + q, mask=live, other=0) == s)
    tl.store(first_ptr + i, first, mask=mask)


@fast_launch
@triton.jit(do_not_specialize=["low"])
def rank_gather_kernel(tmp_sort, tmp_pos, counts_ptr, ends_ptr, out_sort, out_perm,
                       keys_ptr, tags_ptr, scores_ptr, s_keys, s_tags, s_scores, s_digests,
                       s_bucket, first_ptr, ev_any, refused_ptr, num_buckets, low,
                       HAS_TAGS: tl.constexpr, POW2: tl.constexpr, BLOCK: tl.constexpr):
    """The counting sort's last step and the gather in one: every miss at its rank by
    (sort key, position) within its bucket's segment (``group.segment_rank``), with its
    fields (as ``gather_kernel`` writes them) and the sorted place of its key's first
    occurrence: the same (key, tag) at the lowest batch position, whose sort key is
    this one's (a second walk of the segment, only in programs holding a repeat).
    Program 0 also clears ``ev_any`` (both words) and the refused count."""
    if tl.program_id(0) == 0:
        tl.store(ev_any, 0)
        tl.store(ev_any + 1, 0)
        tl.store(refused_ptr, 0)
    if tl.program_id(0).to(tl.int64) * BLOCK < tl.load(ends_ptr + num_buckets - 1):
        live, s, pos, start, end, below, equal = segment_rank(tmp_sort, tmp_pos, counts_ptr,
                                                              ends_ptr, num_buckets, low,
                                                              BLOCK)
        at = start + below + equal
        tl.store(out_sort + at, s, mask=live)
        tl.store(out_perm + at, pos, mask=live)
        key, tag = _gather_fields(at, pos, live, live, keys_ptr, tags_ptr, scores_ptr, s_keys,
                                  s_tags, s_scores, s_digests, s_bucket, num_buckets,
                                  HAS_TAGS, POW2)
        first = at
        # An equal sort key at a lower position may be an earlier occurrence of this key:
        # the lowest such position is the first occurrence, and its place is start +
        # below + the equal sort keys at positions lower than its.
        check = live & (equal > 0)
        if tl.max(check.to(tl.int32), axis=0) > 0:
            lowest = pos
            q = start
            open_ = check & (q < end)
            while tl.max(open_.to(tl.int32), axis=0) > 0:
                sq = tl.load(tmp_sort + q, mask=open_, other=0)
                pq = tl.load(tmp_pos + q, mask=open_, other=0)
                cand = open_ & (sq == s) & (pq < lowest)
                lowest = tl.where(_same_key(keys_ptr, tags_ptr, pq, key, tag, cand, HAS_TAGS),
                                  pq, lowest)
                q += 1
                open_ = open_ & (q < end)
            ahead = tl.zeros([BLOCK], dtype=tl.int64)
            q = start
            open_ = check & (lowest < pos) & (q < end)
            while tl.max(open_.to(tl.int32), axis=0) > 0:
                sq = tl.load(tmp_sort + q, mask=open_, other=0)
                pq = tl.load(tmp_pos + q, mask=open_, other=0)
                ahead += (open_ & (sq == s) & (pq < lowest)).to(tl.int64)
                q += 1
                open_ = open_ & (q < end)
            first = tl.where(check & (lowest < pos), start + below + ahead, first)
        tl.store(first_ptr + at, first, mask=live)


def sort_misses(nb: int, keys: torch.Tensor, tags: torch.Tensor | None,
                scores: torch.Tensor, probed: torch.Tensor, sentinel: int, low: int,
                counted: torch.Tensor | None, count: bool, out: tuple
                ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None,
                           torch.Tensor | None]:
    """The upsert's probe sort keys (``probed``) ordered by bucket, and the fields of the
    sorted misses gathered into ``out`` (keys, tags, scores, digests, buckets, first
    occurrences; ``ev_any`` and ``refused`` cleared). ``counted`` (the probe's bucket
    counts, with the counting sort and the block form): the sort covers the misses
    alone; otherwise ``count``: the counting sort of every key, else torch's stable
    sort. Returns (sort keys, permutation, the device's miss count or None, the bucket
    marks for the finalize kernel or None)."""
    tag_arg = tags if tags is not None else keys
    if counted is not None:  # the counting sort's ranking step gathers the misses' fields too
        g = place_by_bucket(probed, nb, low, sentinel, counted=counted)
        rank_gather_kernel[(g.programs,)](
            g.tmp_sort, g.tmp_pos, g.counts, g.ends, g.out_sort, g.out_perm, keys, tag_arg,
            scores, *out, nb, low, HAS_TAGS=tags is not None, POW2=is_pow2(nb),
            BLOCK=g.block, num_warps=GROUP_LAUNCH["rank_warps"])
        # The bucket counts, read by nothing after the ranking: the insert kernels mark the
        # buckets they evict from there (-1), for the finalize kernel's check of the hits.
        return g.out_sort, g.out_perm, misses_of(g, nb), g.counts
    if count:
        sort_key, perm, _ = group_by_bucket(probed, nb, low, sentinel)
    else:
        sort_key, perm = torch.sort(probed, stable=True)
    n = keys.numel()
    gather_kernel[(cdiv(n, 512),)](sort_key, perm, keys, tag_arg, scores, *out, n, nb,
                                   HAS_TAGS=tags is not None, POW2=is_pow2(nb),
                                   SENTINEL=sentinel, BLOCK=512)
    return sort_key, perm, None, None
