"""The upsert's insert step for short runs into free slots: one lane per sorted position.

Most buckets get one or two misses in a call, and most have free slots; the block
form (``upsert_block.py``) still spends a (positions, bucket) tile of byte compares
and scans on each of them. Here each sorted miss places itself:

- it reads the run of its bucket from a window of ``W`` positions either side
  (a longer run is left to the block form) and ranks itself among the run's
  first occurrences by (score desc, key asc, batch position asc), as ``runs.py``;
- it reads its bucket's digest line as 32-bit words and finds the empty slots four
  at a time (a zero byte is an empty slot): rank r < n_empty takes the r-th empty
  slot, the lowest first. Without eviction a higher rank is refused; with it, a run
  of more first occurrences than empty slots is left to the block form, which
  picks victims.

The outcome is the pinned rule's, so results do not depend on thread timing: every
lane reads its bucket as it was before the call, since this kernel writes no table
entry. It only records each position's outcome in ``state`` (``LANE_PLACED``: the
slot in ``out_slots`` is to be written; ``LANE_DEFERRED``: its run is the block
form's) and ``_finalize_kernel`` writes the placed entries after the block form ran.
"""

from __future__ import annotations

import triton
import triton.language as tl

from hashrec.table.ops.find.triton import match_bytes
from hashrec.table.ops.insert.runs import comes_before
from hashrec.table.ops.launch import fast_launch

__all__ = ["LANE_DEFERRED", "LANE_PLACED", "upsert_lanes_kernel"]

LANE_PLACED = tl.constexpr(1)
LANE_DEFERRED = tl.constexpr(2)


@triton.jit
def _nth_empty(empty, rank, col, NONE: tl.constexpr):
    """Column of each row's ``rank``-th empty slot (0-based, lowest slot first), NONE past
    the last, and the row's number of empty slots; ``empty`` is a (rows, words) tile with
    0x80 at each empty byte."""
    b0 = (empty >> 7) & 1
    b1 = (empty >> 15) & 1
    b2 = (empty >> 23) & 1
    count = (b0 + b1 + b2 + (empty >> 31)).to(tl.int32)
    before = tl.cumsum(count, axis=1) - count  # empty slots in the words before
    k = rank[:, None] - before  # the wanted one's rank within this word
    here = (k >= 0) & (k < count)
    # The k-th empty byte of the word: how many of its inclusive byte prefixes hold <= k.
    byte = (b0.to(tl.int32) <= k).to(tl.int32) + ((b0 + b1).to(tl.int32) <= k).to(tl.int32) + (
        (b0 + b1 + b2).to(tl.int32) <= k).to(tl.int32)
    column = tl.min(tl.where(here, col[None, :] * 4 + byte, NONE), axis=1)
    return column, tl.sum(count, axis=1)


@fast_launch
@triton.jit
def upsert_lanes_kernel(in_keys, in_scores, in_bucket, in_first, in_pos, m, t_words,
                        out_slots, out_evicted, state, ALLOW_EVICT: tl.constexpr,
                        CAP: tl.constexpr, LINE: tl.constexpr, W: tl.constexpr,
                        WIN: tl.constexpr, BLOCK: tl.constexpr):
    """Lane i serves sorted position i (``t_words``: the digest array as int32 words)."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    bucket = tl.load(in_bucket + i, mask=i < m, other=-1)
    miss = bucket >= 0  # hits are sorted last, with bucket -1
    outcome = tl.zeros([BLOCK], dtype=tl.int8)
    if tl.max(miss.to(tl.int32), axis=0) > 0:
        # The run: positions of the same bucket in a window of W either side.
        j = i[:, None] + (tl.arange(0, WIN) - W)[None, :]
        near = miss[:, None] & (j >= 0) & (j < m)
        run = near & (tl.load(in_bucket + j, mask=near, other=-1) == bucket[:, None])
        short = miss & (tl.sum(run.to(tl.int32), axis=1) <= W)
        firsts = run & short[:, None]
        firsts = firsts & (tl.load(in_first + j, mask=firsts, other=-1) == j)
        me = short & (tl.load(in_first + i, mask=short, other=-1) == i)
        key = tl.load(in_keys + i, mask=me, other=0)
        score = tl.load(in_scores + i, mask=me, other=0)
        pos = tl.load(in_pos + i, mask=me, other=0)
        before = comes_before(tl.load(in_keys + j, mask=firsts, other=0),
                              tl.load(in_scores + j, mask=firsts, other=0),
                              tl.load(in_pos + j, mask=firsts, other=0),
                              key[:, None], score[:, None], pos[:, None])
        rank = tl.sum((before & firsts).to(tl.int32), axis=1)
        n_in = tl.sum(firsts.to(tl.int32), axis=1)
        # The bucket's empty slots, four to a word.
        col = tl.arange(0, LINE)
        cell = short[:, None] & (col[None, :] < CAP // 4)
        words = tl.load(t_words + bucket[:, None] * (CAP // 4) + col[None, :], mask=cell,
                        other=0).to(tl.uint32, bitcast=True)
        empty = tl.where(cell, match_bytes(words, tl.zeros([BLOCK], dtype=tl.int32)), 0)
        column, n_empty = _nth_empty(empty, rank, col, CAP)
        deferred = miss & ~short
        if ALLOW_EVICT:
            deferred = deferred | (short & (n_in > n_empty))
        place = me & ~deferred
        ok = place & (column < CAP)
        tl.store(out_slots + i, tl.where(ok, bucket * CAP + column, -1), mask=place)
        if ALLOW_EVICT:
            tl.store(out_evicted + i, tl.zeros([BLOCK], dtype=tl.int8), mask=place)
        outcome = tl.where(ok, LANE_PLACED, tl.where(deferred, LANE_DEFERRED, 0)).to(tl.int8)
    tl.store(state + i, outcome, mask=i < m)
