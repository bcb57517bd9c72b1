"""The upsert's misses placed bucket by bucket without sorting them: the lead form.

The sorted pipeline (``upsert.py``: a counting sort of the misses by bucket, then the
lane and block forms and a finalize pass) spends most of an insert call arranging
misses so that each bucket's run sits in one place. Most buckets get one or two misses
in a call and have free slots, and for them a short list per bucket does the same:

1. the probe (``upsert._probe_sort_kernel``) gives every miss a ticket in its bucket's
   count (an atomic add) and writes the first ``K`` tickets' batch positions to the
   bucket's list;
2. ``lead_kernel``, one lane per batch position: the miss holding its bucket's ticket 0
   leads the bucket (when the count is at most ``K``). It reads the listed keys, names the first occurrence of each (key, tag) (the
   lowest position), ranks the first occurrences by (score desc, key asc, position
   asc) as ``runs.py`` does, and reads the bucket's digest line as slot-ordered masks.
   If the bucket has an empty slot for every first occurrence, rank r takes the r-th
   empty slot: the leader writes the entries (key, tag, score, digest), every listed
   position's slot and flags, and the sentinel over their sort keys;
3. whatever no leader placed (a bucket listing more than ``K`` misses, or too few
   empty slots for its new keys: the ones that evict or refuse) keeps its sort key and
   goes through the sorted pipeline, whose block form places it from the bucket as it
   was before the call (no leader wrote that bucket).

The outcome is the pinned rule's and does not depend on thread timing: tickets (and so
the lists' order and the leader) follow timing, but a leader orders its bucket's misses
by their data, and only the leader writes its bucket.
"""

from __future__ import annotations

import triton
import triton.language as tl

from hashrec.table._triton_hash import bucket_of_fast, digest_of, load_tags, tagged_hash
from hashrec.table.ops.find.triton import line_masks, popcount64
from hashrec.table.ops.insert.runs import comes_before
from hashrec.table.ops.insert.upsert_lanes import nth_bit
from hashrec.table.ops.launch import fast_launch

__all__ = ["lead_kernel"]


@fast_launch
@triton.jit
def lead_kernel(sort_ptr, keys_ptr, tags_ptr, scores_ptr, counts_ptr, lists_ptr, tickets_ptr,
                t_words, t_keys,
                t_tags, t_digests, t_scores, slots_ptr, inserted_ptr, created_ptr, n,
                num_buckets, HAS_TAGS: tl.constexpr, POW2: tl.constexpr,
                SENTINEL: tl.constexpr, CAP: tl.constexpr, K: tl.constexpr,
                BLOCK: tl.constexpr):
    """Lane i serves batch position i: a miss (sort key not ``SENTINEL``) whose ticket is 0
    leads its bucket and places the bucket's listed misses when they fit in its empty
    slots (which miss leads changes nothing: the leader orders the list by its data)."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    miss = mask & (tl.load(sort_ptr + i, mask=mask, other=SENTINEL) != SENTINEL)
    lead = miss & (tl.load(tickets_ptr + i, mask=miss, other=1) == 0)
    if tl.max(lead.to(tl.int32), axis=0) > 0:
        key = tl.load(keys_ptr + i, mask=lead, other=0)
        bucket = bucket_of_fast(tagged_hash(key, load_tags(tags_ptr, i, lead, HAS_TAGS)),
                                num_buckets, POW2)
        count = tl.load(counts_ptr + bucket, mask=lead, other=0)
        lead = lead & (count <= K)
        kk = tl.arange(0, K)
        member = lead[:, None] & (kk[None, :] < count[:, None])
        mpos = tl.load(lists_ptr + bucket[:, None] * K + kk[None, :], mask=member,
                       other=0).to(tl.int64)
        if tl.max(lead.to(tl.int32), axis=0) > 0:
            mkey = tl.load(keys_ptr + mpos, mask=member, other=0)
            mtag = load_tags(tags_ptr, mpos, member, HAS_TAGS)
            mscore = tl.load(scores_ptr + mpos, mask=member, other=0)
            # (lanes, j, k): listed k holds the same (key, tag) as listed j.
            same = (mkey[:, :, None] == mkey[:, None, :]) & (mtag[:, :, None] == mtag[:, None, :])
            same = same & member[:, None, :] & member[:, :, None]
            earlier = same & (mpos[:, None, :] < mpos[:, :, None])
            first = member & (tl.sum(earlier.to(tl.int32), axis=2) == 0)
            before = comes_before(mkey[:, None, :], mscore[:, None, :], mpos[:, None, :],
                                  mkey[:, :, None], mscore[:, :, None], mpos[:, :, None])
            rank = tl.sum((before & first[:, None, :]).to(tl.int32), axis=2)
            new = tl.sum(first.to(tl.int32), axis=1)
            lo, hi = line_masks(t_words, bucket, tl.zeros([BLOCK], dtype=tl.int32), lead, CAP,
                                True)
            fits = lead & (new <= popcount64(lo) + popcount64(hi))
            if tl.max(fits.to(tl.int32), axis=0) > 0:
                column = tl.full([BLOCK, K], CAP, dtype=tl.int32)
                for j in tl.static_range(K):
                    at = kk[None, :] == j
                    nth = nth_bit(lo, hi, tl.sum(tl.where(at, rank, 0), axis=1), CAP, K)
                    column = tl.where(at, nth[:, None], column)
                own = bucket[:, None] * CAP + column
                put = first & fits[:, None]
                tl.store(t_keys + own, mkey, mask=put)
                if t_tags is not None:  # None: the table holds tag 0 alone, and keeps it
                    tl.store(t_tags + own, mtag, mask=put)
                tl.store(t_scores + own, mscore, mask=put)
                tl.store(t_digests + own, digest_of(tagged_hash(mkey, mtag)).to(tl.uint8),
                         mask=put)
                # Every listed position takes its first occurrence's slot.
                slot = tl.sum(tl.where(same & first[:, None, :], own[:, None, :], 0), axis=2)
                done = member & fits[:, None]
                tl.store(slots_ptr + mpos, slot, mask=done)
                tl.store(created_ptr + mpos, tl.full([BLOCK, K], 1, dtype=tl.int8), mask=done)
                tl.store(inserted_ptr + mpos, first.to(tl.int8), mask=done)
                tl.store(sort_ptr + mpos, tl.full([BLOCK, K], SENTINEL, dtype=sort_ptr.dtype.element_ty),
                         mask=done)
