"""The upsert's insert step for short runs into free slots: one lane per sorted position.

Most buckets get one or two misses in a call, and most have free slots; the block
form (``upsert_block.py``) still spends a (positions, bucket) tile of byte compares
and scans on each of them. Here each sorted miss places itself:

- it finds the run of its bucket in a window of ``W`` positions either side (a
  longer run is left to the block form), reads the run's first occurrences and
  ranks itself among them by (score desc, key asc, batch position asc), as
  ``runs.py`` does;
- it reads its bucket's digest line as 32-bit words and finds the empty slots four
  at a time (a zero byte is an empty slot): rank r < n_empty takes the r-th empty
  slot, the lowest first. Without eviction a higher rank is refused; with it, a run
  of more first occurrences than empty slots is left to the block form, which
  picks victims (a program whose every bucket is full, as in a full table, leaves
  all its runs to it without ranking them).

The outcome is the pinned rule's and does not depend on thread timing: every lane
reads its bucket's digests as they were before the call, because this kernel writes
a bucket's digests only where no other of its lanes reads that bucket's line. It
writes the placed entries' keys, tags and scores (into slots whose digest still reads
empty) and, in batch order, their slots and flags, and records ``LANE_PLACED`` in
``state`` (``LANE_DEFERRED`` for positions of runs left to the block form);
``_finalize_kernel`` writes their digests after the block form ran. A run of one, the
only miss of its bucket, whose line no other lane reads, writes its digest too and
records ``LANE_DONE``: on an H200 that took insert_or_assign of 1M keys into 64M
slots from 0.306 to 0.303 ms at dim 8 and from 0.531 to 0.526 at 128 (load factor
0.5; 0.547 to 0.543 at 128, 0.75; ``benchmarks/results/upsert_alone_alone.md``
against ``upsert_alone_off.md``, one call). Each
program flags in ``blocks`` whether its positions open a run left to the block form,
whose programs serve the same blocks of positions and skip the unflagged ones; it
counts the flagged blocks in ``flagged``, the host's hint for the next call. With
INLINE no block form follows: each program places the runs it would flag itself, one
by one with the per-run path (``runs.insert_run``, the block form's for long runs),
after its lanes. No other lane reads such a run's bucket but the run's own, which
leave it to the run's opening program whatever they read (the bucket's empty slots
only decrease).

Taking the empty slots from masks the probe kept (two a miss, gathered into sorted
order) instead of the digest array, and so writing whole entries here, was slower on an
H200: the probe and the gather took 25 us more, the finalize kernel 13 us less and the
lanes no less (``benchmarks/results/upsert_rank_gather.md``).
"""

from __future__ import annotations

import triton
import triton.language as tl

from hashrec.table.ops.find.probe import line_masks, match_bytes, pop_lowest, popcount64
from hashrec.table.ops.insert.runs import comes_before, insert_runs
from hashrec.table.ops.launch import fast_launch

__all__ = ["LANE_DEFERRED", "LANE_DONE", "LANE_PLACED", "nth_bit", "upsert_lanes_kernel"]

LANE_PLACED = tl.constexpr(1)
LANE_DEFERRED = tl.constexpr(2)
LANE_DONE = tl.constexpr(3)


@triton.jit
def _nth_empty(prefix, count, rank, col, NONE: tl.constexpr):
    """Column of each row's ``rank``-th empty slot (0-based, lowest slot first), NONE past
    the last, from a (rows, words) tile of per-word byte prefix counts (``prefix``: byte j
    holds the empty slots among bytes 0..j) and the words' counts."""
    k = rank[:, None] - (tl.cumsum(count, axis=1) - count)  # rank within this word
    here = (k >= 0) & (k < count)
    # The k-th empty byte: how many of bytes 0..2's prefixes hold <= k, four compares in
    # one subtraction (each byte of kk | 0x80 minus a prefix keeps its high bit iff k >= it).
    kk = tl.where(here, k, 0).to(tl.uint32) * 0x01010101
    ge = (((kk | 0x80808080) - prefix) & 0x00808080) >> 7
    byte = ((ge * 0x01010101) >> 16) & 0xFF
    return tl.min(tl.where(here, col[None, :] * 4 + byte.to(tl.int32), NONE), axis=1)


@triton.jit
def nth_bit(lo, hi, rank, CAP: tl.constexpr, W: tl.constexpr):
    """Column of each lane's ``rank``-th empty slot (0-based, below W) from slot-ordered
    masks, CAP past the last."""
    for k in tl.static_range(W - 1):
        _, lo2, hi2 = pop_lowest(lo, hi, CAP, True)
        lo = tl.where(k < rank, lo2, lo)
        hi = tl.where(k < rank, hi2, hi)
    return pop_lowest(lo, hi, CAP, True)[0]


@triton.jit
def _run_of(i, bucket, miss, in_bucket, m, W: tl.constexpr, WIN: tl.constexpr):
    """Per lane: offset of its run's first position (<= 0) and the run's length, counted
    within W positions either side (more than W: a long run)."""
    d = tl.arange(0, WIN) - W
    j = i[:, None] + d[None, :]
    near = miss[:, None] & (j >= 0) & (j < m)
    run = near & (tl.load(in_bucket + j, mask=near, other=-1) == bucket[:, None])
    start = tl.min(tl.where(run, d[None, :], W), axis=1)
    return start, tl.sum(run.to(tl.int32), axis=1)


@triton.jit
def _empty_words(t_words, bucket, miss, none, col, CAP: tl.constexpr):
    """Each lane's bucket's empty slots, four to a word, from a (lanes, line) tile of its
    digest words: per word, the byte prefix counts (byte j: empty slots among bytes
    0..j) and the count."""
    line = miss[:, None] & (col[None, :] < CAP // 4)
    words = tl.load(t_words + bucket[:, None] * (CAP // 4) + col[None, :], mask=line,
                    other=0).to(tl.uint32, bitcast=True)
    empty = tl.where(line, match_bytes(words, none), 0)  # ``none``: the empty digest, 0
    prefix = (empty >> 7) * 0x01010101
    return prefix, (prefix >> 24).to(tl.int32)


@triton.jit
def _rank_in_run(in_keys, in_scores, in_first, in_pos, i, start, length, short,
                 W: tl.constexpr):
    """Per lane of a ``short`` run: whether it is its key's first occurrence (``me``), its
    key, score and batch position, its rank among the run's first occurrences (by score
    desc, key asc, batch position asc) and how many first occurrences the run has."""
    # The run's first occurrences, from its start: (lanes, W) positions.
    j = (i + start)[:, None] + tl.arange(0, W)[None, :]
    firsts = short[:, None] & (tl.arange(0, W)[None, :] < length[:, None])
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
    return me, key, score, pos, rank, tl.sum(firsts.to(tl.int32), axis=1)


@triton.jit
def _store_placed(i, pos, slot, key, score, place, ok, length, in_tags, in_digests, t_keys,
                  t_tags, t_scores, t_digests, out_slots, out_evicted, b_slots, b_flags,
                  flag_stride, BLOCK: tl.constexpr):
    """The entries of the lanes that placed their key (``ok``, of those that tried:
    ``place``), and their slots and flags (inserted, created) in batch order: such a key
    is done but for its digest, which only a run of one (the only miss of its bucket,
    whose line no other lane reads) writes here. Returns where a run of one placed."""
    tl.store(t_keys + slot, key, mask=ok)
    if t_tags is not None:  # None: the table holds tag 0 alone, and keeps it
        tl.store(t_tags + slot, tl.load(in_tags + i, mask=ok, other=0), mask=ok)
    tl.store(t_scores + slot, score, mask=ok)
    tl.store(out_slots + i, tl.where(ok, slot, -1), mask=place)
    tl.store(out_evicted + i, tl.zeros([BLOCK], dtype=tl.int8), mask=place)
    tl.store(b_slots + pos, slot, mask=ok)
    one = tl.full([BLOCK], 1, dtype=tl.int8)
    tl.store(b_flags + pos, one, mask=ok)
    tl.store(b_flags + flag_stride + pos, one, mask=ok)
    alone = ok & (length == 1)
    tl.store(t_digests + slot, tl.load(in_digests + i, mask=alone, other=0), mask=alone)
    return alone


@fast_launch
@triton.jit(do_not_specialize=["m"])
def upsert_lanes_kernel(in_keys, in_tags, in_scores, in_bucket, in_first, in_pos, m, t_words,
                        t_keys, t_tags, t_scores, out_slots, out_evicted, state, blocks,
                        misses, b_slots, b_flags, flag_stride, t_digests, in_digests, ev_any,
                        ev_keys, ev_tags, ev_scores, marks, flagged, ALLOW_EVICT: tl.constexpr,
                        CAP: tl.constexpr, CAP_P2: tl.constexpr, LINE: tl.constexpr,
                        W: tl.constexpr, WIN: tl.constexpr, BI: tl.constexpr,
                        MISSES_ONLY: tl.constexpr, MASKS: tl.constexpr, INLINE: tl.constexpr,
                        BLOCK: tl.constexpr):
    """Lane i serves sorted position i (``t_words``: the digest array as int32 words).
    A key it places gets its slot in ``b_slots`` and its inserted and created flags
    (``b_flags``: two rows ``flag_stride`` apart, indexed by batch position).
    ``blocks`` (programs,) int8: 1 where the program's positions open a run left to the
    block form, whose programs serve the same BLOCK positions. MISSES_ONLY: only the
    positions below the misses' count (``misses``, on the device) hold sorted misses;
    the others are neither read nor given a state. MASKS (buckets up to 128 slots): the
    empty slots as slot-ordered bit masks (``line_masks``), each lane's own, instead of
    a (lanes, line) tile of words."""
    if MISSES_ONLY:
        m = tl.load(misses)
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    bucket = tl.load(in_bucket + i, mask=i < m, other=-1)
    miss = bucket >= 0  # hits are sorted last, with bucket -1
    outcome = tl.zeros([BLOCK], dtype=tl.int8)
    opens = bucket < -1  # positions that open a run left to the block form: none yet
    if tl.max(miss.to(tl.int32), axis=0) > 0:
        # The bucket's digest line as 32-bit words, read first: it waits on the bucket alone
        # (a lane of a long run reads it for nothing).
        col = tl.arange(0, LINE)
        none = tl.zeros([BLOCK], dtype=tl.int32)
        if MASKS:
            lo, hi = line_masks(t_words, bucket, none, miss, CAP, True)
            n_empty = popcount64(lo) + popcount64(hi)
        else:
            prefix, count = _empty_words(t_words, bucket, miss, none, col, CAP)
            n_empty = tl.sum(count, axis=1)
        start, length = _run_of(i, bucket, miss, in_bucket, m, W, WIN)
        room = miss & (n_empty > 0)
        if not ALLOW_EVICT:  # a full bucket refuses its run here
            room = miss
        if tl.max(room.to(tl.int32), axis=0) > 0:
            short = miss & (length <= W)
            me, key, score, pos, rank, n_firsts = _rank_in_run(
                in_keys, in_scores, in_first, in_pos, i, start, length, short, W)
            deferred = miss & ~short
            if ALLOW_EVICT:
                deferred = deferred | (short & (n_firsts > n_empty))
            place = me & ~deferred
            column = tl.full([BLOCK], CAP, dtype=tl.int32)
            if tl.max((place & (rank < n_empty)).to(tl.int32), axis=0) > 0:
                if MASKS:
                    column = nth_bit(lo, hi, rank, CAP, W)
                else:
                    column = _nth_empty(prefix, count, rank, col, CAP)
            opens = deferred & (start == 0)
            ok = place & (column < CAP)
            alone = _store_placed(i, pos, bucket * CAP + column, key, score, place, ok, length,
                                  in_tags, in_digests, t_keys, t_tags, t_scores, t_digests,
                                  out_slots, out_evicted, b_slots, b_flags, flag_stride, BLOCK)
            outcome = tl.where(alone, LANE_DONE, tl.where(ok, LANE_PLACED, tl.where(
                deferred, LANE_DEFERRED, 0))).to(tl.int8)
        else:  # every bucket here is full: each run goes to the block form, to evict
            outcome = tl.where(miss, LANE_DEFERRED, 0).to(tl.int8)
            opens = miss & (start == 0)
    tl.store(state + i, outcome, mask=i < m)
    # Whether a run left to the block form opens here (its program serves this block),
    # and how many blocks do so (the host's hint for the next call's launch).
    served = tl.max(opens.to(tl.int8), axis=0)
    if served > 0:  # most programs have none, and skip the runs' loop too
        tl.atomic_add(flagged, 1)
        if INLINE:  # no block form follows: this program places those runs, one by one
            insert_runs(opens, bucket, tl.program_id(0).to(tl.int64) * BLOCK, in_keys, in_tags,
                        in_scores, in_digests, in_bucket, in_first, in_pos, m, t_keys,
                        t_tags, t_digests, t_scores, out_slots, out_evicted, ev_any, ev_keys,
                        ev_tags, ev_scores, marks, ALLOW_EVICT, CAP, CAP_P2, BI, BLOCK)
    if not INLINE:
        tl.store(blocks + tl.program_id(0), served)
