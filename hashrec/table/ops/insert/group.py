"""The upsert's misses grouped by bucket without a full sort: ``group_by_bucket``.

The upsert's sort keys (``upsert._probe_sort_kernel``) put a miss's bucket in the
high bits and a sentinel (the type's maximum) at every other key. A stable sort of
all n of them costs the same however few keys miss, which in a training step's
lookup is most often none or a few. ``group_by_bucket`` returns what
``torch.sort(sort_keys, stable=True)`` returns, bit for bit, from a counting sort
over the buckets:

1. one kernel counts the misses of every bucket (an atomic add, whose ticket gives
   the miss a provisional place in its bucket's segment) and the sentinels of every
   block of positions;
2. one inclusive cumulative sum over [bucket counts | block sentinel counts] gives
   every bucket's segment end and, after all m misses, every block's first sentinel
   position;
3. one kernel writes each miss to its provisional place and each sentinel to its
   final one (sentinels keep the batch order, as in a stable sort);
4. one kernel ranks each miss within its bucket's segment by (sort key, position),
   the stable sort's order, and writes it there. Positions past m, which the device
   reads from the sums, have nothing to do.

``place_by_bucket`` runs steps 1-3 (step 1 left out where the caller's kernel took the
tickets, ``bucket_counts``), and ``segment_rank`` is step 4's walk, for a caller's
kernel that ranks and does more (the upsert gathers the misses' fields there).

The provisional places depend on thread timing; the ranks do not, so neither does
the result. The work is O(n + buckets) plus, per miss, the length of its bucket's
segment (a few keys: misses spread over the buckets by hash).
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from hashrec.table.ops.launch import aligned_rows, cdiv, env_int, fast_launch

__all__ = ["GROUP_LAUNCH", "Grouping", "bucket_counts", "group_by_bucket", "misses_of",
           "place_by_bucket", "segment_rank"]

_BLOCK = 1024
# Warps of a placing program (``_place_kernel``) and of a ranking one (the upsert's
# ``rank_gather_kernel``); benchmarks sweep them (HASHREC_GROUP_PLACE_WARPS,
# HASHREC_GROUP_RANK_WARPS).
GROUP_LAUNCH = {"place_warps": env_int("HASHREC_GROUP_PLACE_WARPS", 4),
                "rank_warps": env_int("HASHREC_GROUP_RANK_WARPS", 4)}


@triton.jit
def _block_keys(sort_ptr, n, low, SENTINEL: tl.constexpr, BLOCK: tl.constexpr):
    """This program's positions, their mask, sort keys, misses and buckets (0 at others)."""
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    s = tl.load(sort_ptr + i, mask=mask, other=SENTINEL)
    miss = mask & (s != SENTINEL)
    return i, mask, s, miss, tl.where(miss, s.to(tl.int64) >> low, 0)


@fast_launch
@triton.jit(do_not_specialize=["n", "low"])
def _count_kernel(sort_ptr, counts_ptr, tickets_ptr, n, num_buckets, low,
                  SENTINEL: tl.constexpr, BLOCK: tl.constexpr):
    """Tickets of the misses in their buckets' counts; every block's sentinel count
    after the buckets' (``counts_ptr + num_buckets + program``)."""
    i, mask, s, miss, bucket = _block_keys(sort_ptr, n, low, SENTINEL, BLOCK)
    if tl.max(miss.to(tl.int32), axis=0) > 0:
        ticket = tl.atomic_add(counts_ptr + bucket, tl.full([BLOCK], 1, tl.int32), mask=miss)
        tl.store(tickets_ptr + i, ticket, mask=miss)
    tl.store(counts_ptr + num_buckets + tl.program_id(0),
             tl.sum((mask & ~miss).to(tl.int32), axis=0))


@fast_launch
@triton.jit(do_not_specialize=["n", "low"])
def _place_kernel(sort_ptr, counts_ptr, ends_ptr, tickets_ptr, tmp_sort, tmp_pos, out_sort,
                  out_perm, n, num_buckets, low, SENTINEL: tl.constexpr,
                  MISSES_ONLY: tl.constexpr, BLOCK: tl.constexpr):
    """Misses to their provisional places; sentinels to their final ones (not with
    MISSES_ONLY)."""
    i, mask, s, miss, bucket = _block_keys(sort_ptr, n, low, SENTINEL, BLOCK)
    pid = tl.program_id(0)
    if tl.max(miss.to(tl.int32), axis=0) > 0:
        start = tl.load(ends_ptr + bucket, mask=miss, other=0) - \
            tl.load(counts_ptr + bucket, mask=miss, other=0)
        at = start.to(tl.int64) + tl.load(tickets_ptr + i, mask=miss, other=0)
        tl.store(tmp_sort + at, s, mask=miss)
        tl.store(tmp_pos + at, i, mask=miss)
    if not MISSES_ONLY:
        kept = mask & ~miss
        first = tl.load(ends_ptr + num_buckets + pid) - tl.load(counts_ptr + num_buckets + pid)
        at = first.to(tl.int64) + tl.cumsum(kept.to(tl.int32), axis=0) - 1
        tl.store(out_sort + at, s, mask=kept)
        tl.store(out_perm + at, i, mask=kept)


@triton.jit
def segment_rank(tmp_sort, tmp_pos, counts_ptr, ends_ptr, num_buckets, low,
                 BLOCK: tl.constexpr):
    """Provisional places [program * BLOCK, +BLOCK) below the misses' count: (live, sort
    key, batch position, segment start and end, sort keys below this one in the segment,
    equal ones at lower positions). A miss's final place is start + the two counts."""
    p = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = p < tl.load(ends_ptr + num_buckets - 1)
    s = tl.load(tmp_sort + p, mask=live, other=0)
    pos = tl.load(tmp_pos + p, mask=live, other=0)
    bucket = tl.where(live, s.to(tl.int64) >> low, 0)
    end = tl.load(ends_ptr + bucket, mask=live, other=0).to(tl.int64)
    start = end - tl.load(counts_ptr + bucket, mask=live, other=0)
    below = tl.zeros([BLOCK], dtype=tl.int64)
    equal = tl.zeros([BLOCK], dtype=tl.int64)
    q = start
    open_ = live & (q < end)
    while tl.max(open_.to(tl.int32), axis=0) > 0:
        sq = tl.load(tmp_sort + q, mask=open_, other=0)
        pq = tl.load(tmp_pos + q, mask=open_, other=0)
        below += (open_ & (sq < s)).to(tl.int64)
        equal += (open_ & (sq == s) & (pq < pos)).to(tl.int64)
        q += 1
        open_ = open_ & (q < end)
    return live, s, pos, start, end, below, equal


@fast_launch
@triton.jit(do_not_specialize=["low"])
def _rank_kernel(tmp_sort, tmp_pos, counts_ptr, ends_ptr, out_sort, out_perm, num_buckets,
                 low, BLOCK: tl.constexpr):
    """Every miss at its rank by (sort key, position) within its bucket's segment."""
    if tl.program_id(0).to(tl.int64) * BLOCK < tl.load(ends_ptr + num_buckets - 1):
        live, s, pos, start, _, below, equal = segment_rank(tmp_sort, tmp_pos, counts_ptr,
                                                            ends_ptr, num_buckets, low, BLOCK)
        tl.store(out_sort + start + below + equal, s, mask=live)
        tl.store(out_perm + start + below + equal, pos, mask=live)


class Grouping(NamedTuple):
    """The counting sort after its placing step: every miss at its provisional place
    (``tmp_sort``, ``tmp_pos``) in its bucket's segment, which ends at ``ends[bucket]``
    and holds ``counts[bucket]`` misses; ``out_sort`` / ``out_perm`` hold the sentinels
    at their final places (unless the misses alone were placed) and take the misses when
    ranked."""

    counts: torch.Tensor
    ends: torch.Tensor
    tmp_sort: torch.Tensor
    tmp_pos: torch.Tensor
    out_sort: torch.Tensor
    out_perm: torch.Tensor
    programs: int  # of _BLOCK provisional places each
    block: int = _BLOCK


def bucket_counts(num_buckets: int, n: int, device: torch.device
                  ) -> tuple[torch.Tensor, torch.Tensor]:
    """Zeroed bucket counts and room for n tickets, for a kernel of the caller's that
    counts the misses itself (``place_by_bucket(counted=...)``, misses only)."""
    return (torch.zeros(num_buckets, dtype=torch.int32, device=device),
            torch.empty(n, dtype=torch.int32, device=device))


def place_by_bucket(sort_keys: torch.Tensor, num_buckets: int, low: int, sentinel: int,
                    counted: tuple[torch.Tensor, torch.Tensor] | None = None) -> Grouping:
    """Steps 1-3 of ``group_by_bucket`` (n > 0); ``_rank_kernel`` (or a kernel of the
    caller's that ranks the same way, ``segment_rank``) finishes it. ``counted``: the
    (counts, tickets) of ``bucket_counts``, already counted by the caller (as step 1
    does); then only the misses are placed."""
    n, device = sort_keys.numel(), sort_keys.device
    programs = cdiv(n, _BLOCK)
    misses_only = counted is not None
    if counted is not None:
        counts, tickets = counted
    else:
        counts = torch.zeros(num_buckets + programs, dtype=torch.int32, device=device)
        tickets = torch.empty(n, dtype=torch.int32, device=device)
        _count_kernel[(programs,)](sort_keys, counts, tickets, n, num_buckets, low,
                                   SENTINEL=sentinel, BLOCK=_BLOCK)
    ends = torch.cumsum(counts, 0, dtype=torch.int32)
    out_sort, tmp_sort = aligned_rows(2, n, sort_keys.dtype, device).unbind(0)
    out_perm, tmp_pos = aligned_rows(2, n, torch.int64, device).unbind(0)
    _place_kernel[(programs,)](sort_keys, counts, ends, tickets, tmp_sort, tmp_pos, out_sort,
                               out_perm, n, num_buckets, low, SENTINEL=sentinel,
                               MISSES_ONLY=misses_only, BLOCK=_BLOCK,
                               num_warps=GROUP_LAUNCH["place_warps"])
    return Grouping(counts, ends, tmp_sort, tmp_pos, out_sort, out_perm, programs)


def misses_of(grouping: Grouping, num_buckets: int) -> torch.Tensor:
    """The misses' count, (1,) int32 on the device."""
    return grouping.ends[num_buckets - 1:num_buckets]


def group_by_bucket(sort_keys: torch.Tensor, num_buckets: int, low: int, sentinel: int
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``torch.sort(sort_keys, stable=True)`` of upsert sort keys (n,) int32 / int64:
    (sorted keys, positions int64), and the misses' count (1,) int32 on the device.
    Every key is ``sentinel`` or a miss whose bucket (< ``num_buckets``) is its value
    shifted right by ``low`` bits."""
    n, device = sort_keys.numel(), sort_keys.device
    if n == 0:
        return (sort_keys.clone(), torch.empty(0, dtype=torch.int64, device=device),
                torch.zeros(1, dtype=torch.int32, device=device))
    g = place_by_bucket(sort_keys, num_buckets, low, sentinel)
    _rank_kernel[(g.programs,)](g.tmp_sort, g.tmp_pos, g.counts, g.ends, g.out_sort,
                                g.out_perm, num_buckets, low, BLOCK=_BLOCK)
    return g.out_sort, g.out_perm, misses_of(g, num_buckets)
