"""The upsert's insert step in block form: one program per block of sorted positions.

The per-position form (``upsert._upsert_kernel``) gives every sorted position a
program, and a position that opens a run of misses walks its bucket alone: about
one dependent chain of loads per run. Here one program serves ``B`` consecutive
sorted positions and places every short run that opens among them at once:

- a run of at most ``W`` misses is read as ``W`` lanes per position, ranked with
  ``W * W`` vector compares, and placed from (B, bucket) tiles of its bucket:
  rank r < n_empty takes the r-th empty slot (a row cumsum), and with eviction,
  rank n_empty + j takes the j-th lowest entry by (score asc, slot asc), found by
  rounds of a row minimum (as many as the row of the block that lacks the most empty
  slots needs), when its score is at least that entry's; lanes past the longest run's
  last first occurrence are skipped;
- a longer run goes through the per-run path (``runs.insert_run``), one at a time.

The rule and its outcome are those of the per-position form: a run is placed by
the program where it opens, from its bucket as it was before the call, so results
do not depend on thread timing. ``B`` is bounded so that a tile holds about
``UPSERT_BLOCK["elements"]`` values: 1,024-slot buckets get 8 positions a program.
"""

from __future__ import annotations

import triton
import triton.language as tl

from hashrec.table.ops.insert.runs import comes_before, insert_runs
from hashrec.table.ops.insert.triton import write_entries
from hashrec.table.ops.insert.upsert_lanes import LANE_DEFERRED, nth_bit
from hashrec.table.ops.launch import env_int, fast_launch, next_pow2

__all__ = ["UPSERT_BLOCK", "block_positions", "lane_width", "upsert_block_kernel"]


# Sorted positions per program unless HASHREC_UPSERT_BLOCK says otherwise: on an H200,
# 32 positions with runs of up to 4 placed from tiles took insert_or_assign of 1M keys
# into 64M slots from 3.3-4.0 ms (per position) to 1.3-1.8 ms at load factors 0.5-1.0
# (benchmarks/results/upsert_launch_gpu.md).
DEFAULT_BLOCK = 32
# Calls of fewer keys skip the lane form unless HASHREC_UPSERT_LANES_MIN says otherwise
# (see UPSERT_BLOCK below).
LANES_MIN = 131072


def _block_from_env() -> int:
    block = env_int("HASHREC_UPSERT_BLOCK", DEFAULT_BLOCK)
    if block < 0 or block & (block - 1):
        raise ValueError(f"HASHREC_UPSERT_BLOCK must be 0 (off) or a power of two, got {block}")
    return block


def _lanes_from_env() -> int:
    lanes = env_int("HASHREC_UPSERT_LANES", 1)
    if lanes not in (0, 1):
        raise ValueError(f"HASHREC_UPSERT_LANES must be 0 (off) or 1 (on), got {lanes}")
    return lanes


def _lanes_min_from_env() -> int:
    least = env_int("HASHREC_UPSERT_LANES_MIN", LANES_MIN)
    if least < 0:
        raise ValueError(f"HASHREC_UPSERT_LANES_MIN must be >= 0, got {least}")
    return least


# block: sorted positions per program (a power of two; 0 keeps the per-position form);
# width: the longest run placed in tiles (and by the lane form); elements: the budget of
# one (B, bucket) tile; lanes: 1 to run the lane form (``upsert_lanes.py``) first, over
# the same blocks of positions, on lane_warps warps: it places the short runs that fit
# in free slots and leaves the rest to the block form; lane_width: the longest run it
# places (0: width, or in buckets over 128 slots wide_lane_width, when not 0: in the
# admission counters' 1,024-slot buckets a large call brings runs of tens of misses a
# bucket, which the block form places at 8 positions a program; on an H200 a width of 32
# there took the admission step of 1M keys into 16M counters 1.67x / 1.69x as fast as 4
# at load factors 0.5 / 0.75, 1.56 against 2.60 ms; 64 no faster;
# benchmarks/results/admission_lanes.md). On unless
# HASHREC_UPSERT_LANES=0, for calls of at least lanes_min keys
# (HASHREC_UPSERT_LANES_MIN; 0: every call). On an H200, with every insert call
# starting at its load factor, it took insert_or_assign of 1M keys (40% new) into 64M
# slots 1.27x / 1.24x as fast at load factors 0.5 / 0.75 (dim 8: 0.484 against 0.618 ms),
# 1.19x / 1.17x at dim 128, and cost 7-9% at 1.0, where every run is left to the block
# form (benchmarks/results/table_gpu_lane_group1.md against table_gpu_lanes_off.md, same
# run). The training run lost 8% of its samples/s with it on for every call, and matched
# it off (1.007) at a lanes_min of 131072, its calls being smaller
# (ab_gpu_x1_upsert_lanes.md).
# num_warps, maxnreg: the block form's warps a program and registers a thread at most (0:
# the compiler's choice), where it runs a program a block. At load factor 1.0 (every
# bucket full) it does most of an insert call's work, issue-bound at 16 warps a
# multiprocessor with 4 warps and 128 registers; 8 warps at 64 (32 warps a
# multiprocessor, 360 bytes of spills, ``benchmarks/kernel_registers.py``) took
# insert_or_assign of 1M keys into 64M slots 1.31 / 1.18 B-KV/s at dims 8 / 64 against
# 1.24 / 1.12 at 4 and 128, and the same within 1% at 0.5 and 0.75
# (benchmarks/results/upsert_evict_launch.md, same call). (Uncapped it took 168, and 128
# had taken 2-6% less time at every load factor, table_gpu_upsert_maxnreg0.md.)
# persistent_warps, persistent_maxnreg: the same for the persistent programs of calls that
# expect few misses (a training lookup), kept at the launch those calls were timed with.
# probe_maxnreg: the same for the upsert's probe (``_probe_sort_kernel``, 96 uncapped;
# 80 or 64 changed nothing measurable); probe_keys: its keys a program (0: 32 a warp, fewer
# for wide buckets, ``find.triton.probe_block``), on probe_warps warps (0: one for a probe
# from masks, else two). With the probe from masks, 32 keys on one warp took
# insert_or_assign of 1M keys into 64M slots 2-3% less time than 64 on two at dims 32 and
# 64, load factors 0.5 and 0.75 (benchmarks/results/upsert_probe_32x1.md against
# upsert_probe_default.md, same call; capped at 80 registers, the same).
# inline: 1, the lane form also places the runs it leaves (longer than its width, or
# evicting) itself, one by one in the program where each opens, and no block form
# follows; 0, the block form places them; -1, the first where the previous call of the
# lane form on the storage left runs to at most 1 / inline_share of its blocks (a host
# hint: both place by the same rule). inline_bi, inline_maxnreg: the incoming keys of a
# run it holds in registers there (longer runs go chunk by chunk) and its registers a
# thread at most (0: the compiler's choice): on sm_90 the per-run path takes the lane
# form from 56 registers to 168 (6 programs a multiprocessor instead of 18) uncapped;
# capped at 80, with runs of 8 in registers, it spills 224 bytes (12 programs; 576 at
# 56, 2,496 at 56 with runs of 16; ``benchmarks/kernel_registers.py``). On an H200, 80
# took insert_or_assign of 1M keys into 64M slots at dim 64 to 0.403 / 0.416 ms at load
# factors 0.5 / 0.75, against 0.417 / 0.428 at 56 and 0.430 / 0.445 uncapped, and the
# lane form then the block form 0.430 / 0.449 (benchmarks/results/upsert_inline.md).
UPSERT_BLOCK = {"block": _block_from_env(), "width": 4, "num_warps": 8, "elements": 8192,
                "lanes": _lanes_from_env(), "lanes_min": _lanes_min_from_env(),
                "lane_warps": 2, "lane_width": 0, "wide_lane_width": 32, "maxnreg": 64,
                "persistent_warps": 4, "persistent_maxnreg": 128, "probe_maxnreg": 0,
                "probe_keys": 0, "probe_warps": 0, "inline": -1, "inline_share": 16,
                "inline_bi": 8, "inline_maxnreg": 80}

_MAX_SCORE = tl.constexpr(0x7FFFFFFFFFFFFFFF)


def lane_width(block: dict, cap: int) -> int:
    """The longest run of misses the lane form places in a ``cap``-slot bucket under
    ``block`` (``UPSERT_BLOCK``'s form: its lane_width and wide_lane_width)."""
    wide = block["wide_lane_width"] if cap > 128 else 0
    return block["lane_width"] or wide or block["width"]


def block_positions(block: int, elements: int, cap: int) -> int:
    """Sorted positions per program: ``block``, at most ``elements`` // the padded bucket."""
    return max(1, min(block, elements // next_pow2(cap)))


@triton.jit
def _column(tile, col, j):
    """tile[:, j] of a (B, W) tile, for a (B,) vector of column indices ``j``."""
    return tl.sum(tl.where(col[None, :] == j[:, None], tile, 0), axis=1)


@triton.jit
def _victims(t_scores, addr, rows, occupied, rounds, B: tl.constexpr, W: tl.constexpr,
             CAP_P2: tl.constexpr):
    """Per row of (B, CAP_P2) cells, the ``rounds`` (at most W) lowest occupied entries by
    (score asc, slot asc): (B, W) bucket columns (CAP_P2 past the last) and their
    scores. The scores are read for whole ``rows`` ((B, CAP_P2), the same along a row
    but past the bucket's end), empty cells too, so that a thread's cells of a row load
    in 16-byte vectors; ``occupied`` then picks among them."""
    col = tl.arange(0, CAP_P2)
    wcol = tl.arange(0, W)
    scores = tl.load(t_scores + addr, mask=rows, other=0)
    free = occupied
    v_col = tl.full([B, W], CAP_P2, dtype=tl.int32)
    v_score = tl.full([B, W], _MAX_SCORE, dtype=tl.int64)
    for j in tl.static_range(W):
        if j < rounds:  # no row pairs more of its keys than it lacks empty slots for
            low = tl.min(tl.where(free, scores, _MAX_SCORE), axis=1)
            pick = tl.min(tl.where(free & (scores == low[:, None]), col[None, :], CAP_P2),
                          axis=1)
            v_col = tl.where(wcol[None, :] == j, pick[:, None], v_col)
            v_score = tl.where(wcol[None, :] == j, low[:, None], v_score)
            free = free & (col[None, :] != pick[:, None])
    return v_col, v_score


@triton.jit
def _place_short_runs(at, bucket, short, in_keys, in_tags, in_scores, in_digests, in_bucket,
                      in_first, in_pos, m, t_keys, t_tags, t_digests, t_scores, out_slots,
                      out_evicted, ev_any, ev_keys, ev_tags, ev_scores, marks,
                      ALLOW_EVICT: tl.constexpr,
                      CAP: tl.constexpr, CAP_P2: tl.constexpr, B: tl.constexpr,
                      W: tl.constexpr):
    """Places the runs of at most W misses that open at positions ``at`` where ``short``."""
    col = tl.arange(0, CAP_P2)
    wcol = tl.arange(0, W)
    # The runs' lanes: (B, W) positions, first occurrences only.
    i2 = at[:, None] + wcol[None, :]
    m2 = short[:, None] & (i2 < m)
    m2 = m2 & (tl.load(in_bucket + i2, mask=m2, other=-1) == bucket[:, None])
    m2 = m2 & (tl.load(in_first + i2, mask=m2, other=-1) == i2)
    key2 = tl.load(in_keys + i2, mask=m2, other=0)
    score2 = tl.load(in_scores + i2, mask=m2, other=0)
    pos2 = tl.load(in_pos + i2, mask=m2, other=0)
    n_in = tl.sum(m2.to(tl.int32), axis=1)
    # The buckets before the call: empty slots, their ranks and count.
    addr = (bucket * CAP)[:, None] + col[None, :]
    cell = short[:, None] & (col[None, :] < CAP)
    empty = cell & (tl.load(t_digests + addr, mask=cell, other=1) == 0)
    n_empty = tl.sum(empty.to(tl.int32), axis=1)
    # Where no run's bucket has an empty slot (a full table, where this form does most of
    # the work), each lane's search of them is skipped. Buckets of up to 128 slots keep
    # their empty slots as two slot-ordered 64-bit masks a run, so that no (B, CAP_P2)
    # tile stays live across the lanes; wider ones, as a tile of ranks.
    roomy = tl.max(n_empty, axis=0) > 0
    lo = tl.zeros([B], dtype=tl.uint64)
    hi = lo
    if CAP_P2 <= 128:
        empty_rank = empty  # not read
        if roomy:
            one = tl.full([1, CAP_P2], 1, dtype=tl.uint64)
            bit = tl.where(empty, one << (col[None, :] % 64).to(tl.uint64), 0)
            lo = tl.sum(tl.where(col[None, :] < 64, bit, 0), axis=1)
            hi = tl.sum(tl.where(col[None, :] >= 64, bit, 0), axis=1)
    else:
        empty_rank = tl.zeros([B, CAP_P2], dtype=tl.int32)
        if roomy:
            empty_rank = tl.cumsum(empty.to(tl.int32), axis=1) - 1
    v_col = tl.full([B, W], CAP_P2, dtype=tl.int32)
    v_score = tl.full([B, W], _MAX_SCORE, dtype=tl.int64)
    if ALLOW_EVICT:
        need = short & (n_in > n_empty)
        rounds = tl.max(tl.where(need, n_in - n_empty, 0), axis=0)
        if rounds > 0:
            rows = cell & need[:, None]
            v_col, v_score = _victims(t_scores, addr, rows, rows & ~empty, rounds, B, W,
                                      CAP_P2)
    # Lanes past every run's last first occurrence have nothing to place.
    lanes = tl.max(tl.max(tl.where(m2, wcol[None, :] + 1, 0), axis=1), axis=0)
    for w in tl.static_range(W):
        if w < lanes:
            _place_lane(w, at, bucket, m2, key2, score2, pos2, n_empty, roomy, lo, hi, empty,
                        empty_rank, v_col, v_score, in_tags, in_digests, t_keys, t_tags, t_digests,
                        t_scores, out_slots, out_evicted, ev_any, ev_keys, ev_tags, ev_scores,
                        marks, ALLOW_EVICT, CAP, CAP_P2, B, W)


@triton.jit
def _place_lane(w: tl.constexpr, at, bucket, m2, key2, score2, pos2, n_empty, roomy, lo, hi,
                empty, empty_rank, v_col, v_score, in_tags, in_digests, t_keys, t_tags, t_digests,
                t_scores, out_slots, out_evicted, ev_any, ev_keys, ev_tags, ev_scores, marks,
                ALLOW_EVICT: tl.constexpr, CAP: tl.constexpr, CAP_P2: tl.constexpr,
                B: tl.constexpr, W: tl.constexpr):
    """Places lane w of the runs in (B, W) tiles ``m2`` / ``key2`` / ...: the run's
    first occurrence there (if any) takes its rank's empty slot or victim."""
    col = tl.arange(0, CAP_P2)
    wcol = tl.arange(0, W)
    i = at + w
    lane_w = tl.full([B], w, dtype=tl.int32)
    mi = _column(m2.to(tl.int32), wcol, lane_w) > 0
    key = _column(key2, wcol, lane_w)
    score = _column(score2, wcol, lane_w)
    pos = _column(pos2, wcol, lane_w)
    before = comes_before(key2, score2, pos2, key[:, None], score[:, None], pos[:, None])
    rank = tl.sum((before & m2).to(tl.int32), axis=1)
    slot_col = tl.full([B], CAP_P2, dtype=tl.int32)
    if roomy:  # some run's bucket has an empty slot
        if CAP_P2 <= 128:  # the rank-th set bit of the run's masks (CAP past the last)
            slot_col = nth_bit(lo, hi, rank, CAP, W)
            slot_col = tl.where(slot_col < CAP, slot_col, CAP_P2)
        else:
            to_empty = empty & (empty_rank == rank[:, None])
            slot_col = tl.min(tl.where(to_empty, col[None, :], CAP_P2), axis=1)
    ev = mi & (rank < 0)  # no eviction but by the rule below
    if ALLOW_EVICT:
        over = mi & (rank >= n_empty)
        j = tl.where(over, rank - n_empty, 0)
        pick = _column(v_col, wcol, j)
        ev = over & (pick < CAP_P2) & (score >= _column(v_score, wcol, j))
        slot_col = tl.where(ev, pick, slot_col)
    ok = mi & (slot_col < CAP_P2)
    slot = bucket * CAP + slot_col
    write_entries(i, mi, ok, ev, slot, key, score, in_tags, in_digests, t_keys, t_tags,
                  t_digests, t_scores, out_evicted, ev_any, ev_keys, ev_tags, ev_scores, marks,
                  bucket, ALLOW_EVICT)
    tl.store(out_slots + i, tl.where(ok, slot, -1), mask=mi)


@triton.jit
def _serve(p, in_keys, in_tags, in_scores, in_digests, in_bucket, in_first, in_pos, m, t_keys,
           t_tags, t_digests, t_scores, out_slots, out_evicted, ev_any, ev_keys, ev_tags, ev_scores,
           marks, state, ALLOW_EVICT: tl.constexpr, CAP: tl.constexpr, CAP_P2: tl.constexpr,
           BI: tl.constexpr, B: tl.constexpr, W: tl.constexpr, LANES: tl.constexpr):
    """Places the runs that open at sorted positions [p * B, (p + 1) * B) (with LANES,
    only those ``upsert_lanes_kernel`` left to this form)."""
    lane = tl.arange(0, B)
    at = p.to(tl.int64) * B + lane
    bucket = tl.load(in_bucket + at, mask=at < m, other=-1)
    prev = tl.load(in_bucket + at - 1, mask=(at > 0) & (at < m), other=-1)
    opens = (bucket >= 0) & (prev != bucket)  # hits, sorted last, open nothing
    if LANES:
        opens = opens & (tl.load(state + at, mask=opens, other=0) == LANE_DEFERRED)
    if tl.max(opens.to(tl.int32), axis=0) > 0:
        tail = at + W
        long = opens & (tl.load(in_bucket + tail, mask=opens & (tail < m), other=-1) == bucket)
        short = opens & ~long
        if tl.max(short.to(tl.int32), axis=0) > 0:
            _place_short_runs(at, bucket, short, in_keys, in_tags, in_scores, in_digests,
                              in_bucket, in_first, in_pos, m, t_keys, t_tags, t_digests,
                              t_scores, out_slots, out_evicted, ev_any, ev_keys, ev_tags, ev_scores,
                              marks, ALLOW_EVICT, CAP, CAP_P2, B, W)
        insert_runs(long, bucket, p.to(tl.int64) * B, in_keys, in_tags, in_scores, in_digests,
                    in_bucket, in_first, in_pos, m, t_keys, t_tags, t_digests, t_scores,
                    out_slots, out_evicted, ev_any, ev_keys, ev_tags, ev_scores, marks,
                    ALLOW_EVICT, CAP, CAP_P2, BI, B)


@fast_launch
@triton.jit(do_not_specialize=["m"])
def upsert_block_kernel(in_keys, in_tags, in_scores, in_digests, in_bucket, in_first, in_pos,
                        m, t_keys, t_tags, t_digests, t_scores, out_slots, out_evicted, ev_any,
                        ev_keys, ev_tags, ev_scores, marks, state, blocks, misses,
                        ALLOW_EVICT: tl.constexpr, CAP: tl.constexpr, CAP_P2: tl.constexpr,
                        BI: tl.constexpr, B: tl.constexpr, W: tl.constexpr,
                        LANES: tl.constexpr, PERSISTENT: tl.constexpr,
                        MISSES_ONLY: tl.constexpr):
    """Program p serves sorted positions [p * B, (p + 1) * B). With LANES, only where
    ``upsert_lanes_kernel`` flagged the block in ``blocks`` (it left runs to this form).
    Serving several flagged blocks a program, one after the other, so that fewer
    programs start only to read a flag, was slower on an H200: 8 a program took
    insert_or_assign of 1M keys 13-15% longer at load factor 1.0 and 1-4% at 0.75
    (benchmarks/results/table_gpu_lane_group8.md against _lane_group1.md, same run).
    So was a grid of 2 or 4 programs a multiprocessor, each reading the flags of a
    stride of blocks: 0.499 / 0.474 ms against 0.462 at load factor 0.5, 1.41 / 1.24
    against 1.08 at 1.0 (table_gpu_lane_grid2.md, _lane_grid4.md against table_gpu.md as of
    b35ba5c). So was a list of the flagged blocks, appended to by the lane form, served
    by 1 to 16 programs a multiprocessor: at most 2% faster at load factors 0.5 and 0.75,
    15% slower at 1.0 (benchmarks/results/upsert_listed.md, tree 077c4cb); taking the
    listed blocks one at a time from an atomic counter instead, this kernel took 33 us
    against 42 at load factor 0.5 and 641 against 520 at 1.0
    (benchmarks/results/upsert_rank_gather.md). What is kept instead: the lane form
    placing those runs itself where the previous call flagged few blocks, no block form
    launched (``upsert._lanes_inline``, benchmarks/results/upsert_inline.md).

    PERSISTENT (without LANES): the grid is a few programs a multiprocessor, which serve
    the blocks up to the misses' count (``misses``, on the device) in a stride: a call
    whose misses are few (a warm table's training lookup) starts a few hundred programs
    where one a block would start n / B. MISSES_ONLY (implied by PERSISTENT): only the
    sorted positions below the misses' count hold misses; the rest are not read."""
    if PERSISTENT:  # the sorted positions past the misses' count hold nothing to read
        p = tl.program_id(0)
        count = tl.load(misses)
        used = (count + B - 1) // B
        while p < used:
            _serve(p, in_keys, in_tags, in_scores, in_digests, in_bucket, in_first, in_pos, count,
                   t_keys, t_tags, t_digests, t_scores, out_slots, out_evicted, ev_any, ev_keys,
                   ev_tags, ev_scores, marks, state, ALLOW_EVICT, CAP, CAP_P2, BI, B, W, False)
            p += tl.num_programs(0)
    elif not LANES or tl.load(blocks + tl.program_id(0)) != 0:
        # A name of its own: m itself is not reassigned under a run-time condition (a call
        # of one key makes it a compile-time 1).
        used = m
        if MISSES_ONLY:
            used = tl.load(misses)
        _serve(tl.program_id(0), in_keys, in_tags, in_scores, in_digests, in_bucket, in_first,
               in_pos, used, t_keys, t_tags, t_digests, t_scores, out_slots, out_evicted, ev_any,
               ev_keys, ev_tags, ev_scores, marks, state, ALLOW_EVICT, CAP, CAP_P2, BI, B, W,
               LANES)

