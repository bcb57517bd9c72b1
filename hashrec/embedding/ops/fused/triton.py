"""Triton kernels of the embedding training step.

* ``pool_rows``: pools bags (sum / mean, optional per-id weights) reading each id's
  row either from deduplicated rows (U, D) or straight from table rows by slot
  (a missing slot reads a fallback row), in one pass into the (B, D) output.
* ``reduce_rows``: for every unique id, sums the gradient rows of its positions
  in a fixed order (the CSR grouping from ``dedup``, no atomics, so the result is
  independent of thread timing), then either writes the (U, D) sum or applies the
  sparse optimizer to the table row [embedding | state] in the same program. The
  sum is a segmented scan over fixed chunks of the sorted positions, so an id
  that occurs tens of thousands of times is spread over many programs; ids that
  cross a chunk boundary are finished by a second, short pass over the chunk
  partials.

  A join of several storages (``hashrec.embedding.joint``) passes each member's
  unique-row bounds as ``groups``: every member's positions then start a chunk
  of their own, so its rows are summed in the same grouping as the member's
  alone, bit for bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hashrec.table.ops.launch import cdiv, fast_launch, next_pow2
from hashrec.table.ops.optimizer.triton import (
    KernelHyper,
    kernel_hyper,
    update_rows,
)
from hashrec.table.ops.tiles import load_rows


def _dim_block(dim: int) -> int:
    """Column block: at least 64 wide (a [64, 16] tile of these kernels failed to compile
    with triton 3.6 on sm_90; [32, 64] tiles compile, and with ``dim`` unspecialized
    every dim <= 64 runs that same binary)."""
    return max(64, next_pow2(dim))


def _pool_body(src, src_stride, slots_ptr, fallback_ptr, inverse_ptr, offsets_ptr, weights_ptr,
                 out_ptr, num_bags, dim, FROM_TABLE: tl.constexpr, HAS_FALLBACK: tl.constexpr,
                 ONE_LOAD: tl.constexpr, HAS_W: tl.constexpr, MEAN: tl.constexpr,
                 ONE_ID: tl.constexpr, DIM_P2: tl.constexpr, EVEN: tl.constexpr,
                 BB: tl.constexpr):
    if EVEN:  # dim == DIM_P2: a compile-time width, so rows move as 16-byte vectors
        dim = DIM_P2
    bags = tl.program_id(0).to(tl.int64) * BB + tl.arange(0, BB)
    bmask = bags < num_bags
    if ONE_ID:  # bag b is id b: no offsets to read (in the layer's forward on an H200,
        # 0.184 ms against 0.211: embedding_layer_gpu_trace.txt, _tiles_trace.txt)
        start = bags
        length = bmask.to(tl.int64)
    else:
        start = tl.load(offsets_ptr + bags, mask=bmask, other=0)
        length = tl.load(offsets_ptr + bags + 1, mask=bmask, other=0) - start
    col = tl.arange(0, DIM_P2)
    cmask = col[None, :] < dim
    acc = tl.zeros([BB, DIM_P2], dtype=tl.float32)
    longest = tl.max(length, axis=0)
    j = longest * 0
    while j < longest:
        live = bmask & (j < length)
        row = tl.load(inverse_ptr + start + j, mask=live, other=0)
        if FROM_TABLE:
            slot = tl.load(slots_ptr + row, mask=live, other=-1)
            # A row from the table or from the fallback rows in one load: in the layer's
            # forward on an H200 the pooling took 0.211 ms against 0.242 with a masked load
            # from each (embedding_layer_gpu_trace_one_load.txt, _trace_two_loads.txt).
            if ONE_LOAD:
                stored = slot >= 0
                at = tl.where(stored, src + tl.where(stored, slot, 0) * src_stride,
                              fallback_ptr + row * dim)
                if EVEN:  # lanes that are not live read the fallback's row 0
                    x = tl.load(at[:, None] + col[None, :])
                    x = tl.where(live[:, None], x, tl.zeros_like(x))
                else:
                    x = tl.load(at[:, None] + col[None, :], mask=live[:, None] & cmask,
                                other=0.0)
            else:
                x = load_rows(src, slot, src_stride, col, live & (slot >= 0), cmask, EVEN)
                if HAS_FALLBACK:  # else a missing row reads zeros
                    x = x.to(tl.float32) + load_rows(fallback_ptr, row, dim, col,
                                                     live & (slot < 0), cmask, EVEN)
        else:
            x = load_rows(src, row, src_stride, col, live, cmask, EVEN)
        x = x.to(tl.float32)
        if HAS_W:
            x = x * tl.load(weights_ptr + start + j, mask=live, other=0.0)[:, None]
        acc += x
        j += 1
    if MEAN:
        acc = acc / tl.maximum(length, 1).to(tl.float32)[:, None]
    tl.store(out_ptr + bags[:, None] * dim + col[None, :], acc, mask=bmask[:, None] & cmask)


# Narrow rows (stride < 64) compile with dim and stride unspecialized: a [BB, 64] gather
# with a stride divisible by 16 failed to compile (triton 3.6, sm_90: "mask type matches
# ptr type"). Wide rows keep the stride specialized, so row loads are 16-byte vectors.
# A feature's ids, offsets and weights, and the slots of a sharded lookup's rows, are
# slices at offsets the data sets, read by bag or by id (gathers) whatever their
# alignment: compiled unspecialized on it, so a batch does not compile a variant of its
# own. (For sm_90 the PTX is the same either way for the slots, and for all four with one
# id a bag; with offsets, aligned ones load two at a time.) num_bags (the batch size) is
# unspecialized too, so an epoch's short last batch compiles no variant: compiled for
# sm_90 at benchmark B's launch (one id a bag from table rows, dim 128, 4 bags a program)
# the kernel takes 40 registers either way and 224 SASS instructions against 192 with
# the size divisible by 16; on an H200 B ran alike either way at 104,864 bags a table
# (divisible) and at its own 104,857 (benchmarks/results/pool_bags.md).
_POOL_SLICES = ["slots_ptr", "inverse_ptr", "offsets_ptr", "weights_ptr"]
_pool_kernel_narrow = fast_launch(triton.jit(
    do_not_specialize=["dim", "src_stride", "num_bags"],
    do_not_specialize_on_alignment=_POOL_SLICES)(_pool_body))
_pool_kernel_wide = fast_launch(triton.jit(
    do_not_specialize=["dim", "num_bags"],
    do_not_specialize_on_alignment=_POOL_SLICES)(_pool_body))


# The pooling launch: {"rows": bags a program (a power of two), "num_warps"}; None
# keeps the default, ``_pool_config``. Benchmarks may set it.
POOL_CONFIG: dict | None = None


def _pool_config(dim_p2: int) -> dict:
    """About 512 elements a program on one warp. On an H200, pooling 1M one-id bags of
    dim 128 from unique rows took 0.195 ms against 0.261 at 2048 elements on 4 warps, the
    earlier choice (1.34x); 1.27x at dim 64, 1.21x at dim 256; from table rows by slot,
    1.28-1.43x (benchmarks/results/sweep_rows_gpu*.md)."""
    return {"rows": max(1, 512 // dim_p2), "num_warps": 1}


def pool_rows(rows: torch.Tensor, inverse: torch.Tensor, offsets: torch.Tensor | None,
              weights: torch.Tensor | None, mean: bool, slots: torch.Tensor | None = None,
              dim: int | None = None, one_id: bool = False) -> torch.Tensor:
    """Pools bags into (B, dim) float32.

    Without ``slots``, ``rows`` (U, D) are the unique rows and ``inverse`` indexes
    them. With ``slots`` (U,) int64, ``rows`` is the table's value matrix
    (R, row_dim): id ``i`` reads ``rows[slots[inverse[i]], :dim]``; unique ids whose
    slot is -1 read zeros (a missing row; pass ``fallback`` rows via
    ``pool_rows_with_fallback``). ``one_id``: the caller vouches that every bag holds
    exactly one id (bag b is id b: ``offsets`` is not read and may be None).
    """
    return pool_rows_with_fallback(rows, inverse, offsets, weights, mean, slots, None, dim,
                                   one_id)


def pool_rows_with_fallback(rows: torch.Tensor, inverse: torch.Tensor,
                            offsets: torch.Tensor | None,
                            weights: torch.Tensor | None, mean: bool,
                            slots: torch.Tensor | None, fallback: torch.Tensor | None,
                            dim: int | None = None, one_id: bool = False) -> torch.Tensor:
    """``pool_rows`` where unique ids with slot -1 read ``fallback`` (U, dim) float32 rows."""
    rows = rows if rows.stride(1) == 1 else rows.contiguous()
    dim = rows.shape[1] if dim is None else dim
    if offsets is None and not one_id:
        raise ValueError("offsets may be None only with one_id")
    num_bags = inverse.numel() if offsets is None else offsets.numel() - 1
    out = torch.empty(num_bags, dim, dtype=torch.float32, device=rows.device)
    if num_bags == 0:
        return out
    dim_p2 = _dim_block(dim)
    # rows that are not live read row 0 of the table and of the fallback rows
    even = dim == dim_p2 and rows.shape[0] > 0 and (fallback is None or fallback.shape[0] > 0)
    config = POOL_CONFIG or _pool_config(dim_p2)
    bb = config["rows"]
    kernel = _pool_kernel_wide if rows.stride(0) >= 64 else _pool_kernel_narrow
    kernel[(cdiv(num_bags, bb),)](
        rows, rows.stride(0), slots if slots is not None else inverse,
        fallback.contiguous() if fallback is not None else rows, inverse.contiguous(),
        offsets.contiguous() if offsets is not None else inverse,
        weights.contiguous() if weights is not None else rows, out,
        num_bags, dim, FROM_TABLE=slots is not None, HAS_FALLBACK=fallback is not None,
        ONE_LOAD=slots is not None and fallback is not None and fallback.dtype == rows.dtype,
        HAS_W=weights is not None, MEAN=mean, ONE_ID=one_id,
        DIM_P2=dim_p2, EVEN=even, BB=bb, num_warps=config["num_warps"])
    return out


@triton.jit
def _seg_add(a, a_start, b, b_start):
    """Segmented sum: restart at b when b opens a segment."""
    return tl.where(b_start != 0, b, a + b), a_start | b_start


@triton.jit
def _position_grads(grad_ptr, gidx_ptr, weights_ptr, offsets_ptr, order_ptr, p, live, col,
                    dim, HAS_W: tl.constexpr, MEAN: tl.constexpr, EVEN: tl.constexpr,
                    SORTED: tl.constexpr):
    """Gradient rows (P, DIM_P2) fp32 of sorted positions ``p`` (weights / bag means applied).
    SORTED: ``gidx`` and ``weights`` are per sorted position, so no load of ``order``."""
    pos = p if SORTED else tl.load(order_ptr + p, mask=live, other=0)
    g_row = tl.load(gidx_ptr + pos, mask=live, other=0)
    g = load_rows(grad_ptr, g_row, dim, col, live, col[None, :] < dim, EVEN).to(tl.float32)
    if HAS_W:
        g = g * tl.load(weights_ptr + pos, mask=live, other=0.0)[:, None]
    if MEAN:
        length = (tl.load(offsets_ptr + g_row + 1, mask=live, other=1)
                  - tl.load(offsets_ptr + g_row, mask=live, other=0))
        g = g / tl.maximum(length, 1).to(tl.float32)[:, None]
    return g


@triton.jit
def _finish_rows(acc, rows, done, col, out_ptr, slots_ptr, t_values, dim, row_dim, lr, eps,
                 beta1, beta2, wd, adam_scale, APPLY: tl.constexpr, OPT: tl.constexpr,
                 DIM_P2: tl.constexpr, EVEN: tl.constexpr):
    """Writes the summed gradient of unique rows ``rows`` where ``done``, or applies it."""
    if APPLY:
        slot = tl.load(slots_ptr + rows, mask=done, other=-1)
        update_rows(t_values, slot, done & (slot >= 0), acc, row_dim, dim, lr, eps, beta1,
                    beta2, wd, adam_scale, OPT, DIM_P2, EVEN)
    else:
        tl.store(out_ptr + rows[:, None] * dim + col[None, :], acc,
                 mask=done[:, None] & (col[None, :] < dim))


@triton.jit
def _chunk_spans(c, n, bounds_ptr, row_start_ptr, groups, GROUPS: tl.constexpr,
                 GROUPS_P2: tl.constexpr, CH: tl.constexpr):
    """Sorted positions [lo, hi) of chunks ``c`` (a vector): CH at a time from 0, or with
    GROUPS, CH at a time from the first position of each group of unique rows (``bounds``
    (groups + 1,)), chunk after chunk, group after group. A chunk past the last is empty
    (hi <= lo)."""
    if GROUPS:
        g = tl.arange(0, GROUPS_P2)
        gm = g < groups
        first = tl.load(row_start_ptr + tl.load(bounds_ptr + g, mask=gm, other=0), mask=gm,
                        other=0)
        end = tl.load(row_start_ptr + tl.load(bounds_ptr + g + 1, mask=gm, other=0), mask=gm,
                      other=0)
        chunks = (end - first + CH - 1) // CH
        after = tl.cumsum(chunks, 0)
        # at most one group holds a chunk
        mine = (c[:, None] >= (after - chunks)[None, :]) & (c[:, None] < after[None, :])
        found = tl.sum(mine.to(tl.int32), 1) > 0
        lo = tl.sum(tl.where(mine, first[None, :] + (c[:, None] - (after - chunks)[None, :])
                             * CH, 0), 1)
        hi = tl.minimum(lo + CH, tl.sum(tl.where(mine, end[None, :], 0), 1))
        lo = tl.where(found, lo, n)
        hi = tl.where(found, hi, n)
    else:
        lo = c * CH
        hi = tl.minimum(lo + CH, n)
    return lo, hi


# dim is not specialized: a dim divisible by 16 failed to compile (triton 3.6, sm_90);
# EVEN (dim == DIM_P2) makes it a compile-time constant instead.
@fast_launch
@triton.jit(do_not_specialize=["n", "dim", "groups"])
def _chunk_kernel(grad_ptr, gidx_ptr, weights_ptr, offsets_ptr, order_ptr, seg_ptr,
                  row_start_ptr, bounds_ptr, part_ptr, out_ptr, slots_ptr, t_values, n,
                  groups, dim, row_dim, lr, eps, beta1, beta2, wd, adam_scale,
                  HAS_W: tl.constexpr, MEAN: tl.constexpr, SORTED: tl.constexpr,
                  APPLY: tl.constexpr, OPT: tl.constexpr, DIM_P2: tl.constexpr,
                  EVEN: tl.constexpr, GROUPS: tl.constexpr, GROUPS_P2: tl.constexpr,
                  CH: tl.constexpr):
    """Stage 1: segmented sum over the CH (or fewer) sorted positions of chunk c.

    Segments (unique ids) that lie inside the chunk are finished here; the sum of
    the chunk's first segment when it began earlier (head) and of its last one when
    it goes on past the chunk (tail) go to ``part[chunk, 0 / 1]``.
    """
    if EVEN:  # dim == DIM_P2 (see _pool_body)
        dim = DIM_P2
    c = tl.program_id(0).to(tl.int64)
    spans = _chunk_spans(c + tl.zeros([2], dtype=tl.int64), n, bounds_ptr, row_start_ptr,
                         groups, GROUPS, GROUPS_P2, CH)
    lo, hi = tl.max(spans[0], 0), tl.max(spans[1], 0)
    i = tl.arange(0, CH)
    p = lo + i
    live = p < hi
    col = tl.arange(0, DIM_P2)
    g = _position_grads(grad_ptr, gidx_ptr, weights_ptr, offsets_ptr, order_ptr, p, live, col,
                        dim, HAS_W, MEAN, EVEN, SORTED)
    r = tl.load(seg_ptr + p, mask=live, other=-1)
    prev = tl.load(seg_ptr + p - 1, mask=live & (i > 0), other=-2)
    nxt = tl.load(seg_ptr + p + 1, mask=(p + 1) < hi, other=-3)
    opens = tl.broadcast_to((r != prev).to(tl.int32)[:, None], (CH, DIM_P2))
    acc, _ = tl.associative_scan((g, opens), 0, _seg_add)
    ends = live & (r != nxt)
    first = tl.load(row_start_ptr + r, mask=ends, other=0)
    last = tl.load(row_start_ptr + r + 1, mask=ends, other=0)
    inside = ends & (first >= lo) & (last <= hi)
    _finish_rows(acc, r, inside, col, out_ptr, slots_ptr, t_values, dim, row_dim, lr, eps,
                 beta1, beta2, wd, adam_scale, APPLY, OPT, DIM_P2, EVEN)
    which = tl.where(first < lo, 0, 1)
    tl.store(part_ptr + ((c * 2 + which) * DIM_P2)[:, None] + col[None, :], acc,
             mask=(ends & ~inside)[:, None])


# dim is not specialized: a dim divisible by 16 failed to compile (triton 3.6, sm_90);
# EVEN (dim == DIM_P2) makes it a compile-time constant instead.
@fast_launch
@triton.jit(do_not_specialize=["n", "dim", "groups", "chunks"])
def _combine_kernel(seg_ptr, row_start_ptr, bounds_ptr, part_ptr, out_ptr, slots_ptr, t_values,
                    n, chunks, groups, dim, row_dim, lr, eps, beta1, beta2, wd, adam_scale,
                    APPLY: tl.constexpr, OPT: tl.constexpr, DIM_P2: tl.constexpr,
                    EVEN: tl.constexpr, GROUPS: tl.constexpr, GROUPS_P2: tl.constexpr,
                    CH: tl.constexpr, CB: tl.constexpr, BK: tl.constexpr):
    """Stage 2 over CB chunks: the segment that leaves a chunk as its tail sums its tail
    partial and, in chunk order, the head partials of the chunks it covers (the next ones:
    a segment never leaves its group), then is finished. Segments that end within two
    more chunks (nearly all) are summed side by side; longer ones, BK heads at a time."""
    if EVEN:
        dim = DIM_P2
    lane = tl.arange(0, CB)
    c = tl.program_id(0).to(tl.int64) * CB + lane
    lo, hi = _chunk_spans(c, n, bounds_ptr, row_start_ptr, groups, GROUPS, GROUPS_P2, CH)
    live = (c < chunks) & (hi > lo)
    r = tl.load(seg_ptr + hi - 1, mask=live, other=0)
    first = tl.load(row_start_ptr + r, mask=live, other=0)
    last = tl.load(row_start_ptr + r + 1, mask=live, other=0)
    tail = live & (first >= lo) & (last > hi)
    end_chunk = tl.where(tail, c + (last - 1 - lo) // CH, c)
    near = tail & (end_chunk <= c + 2)
    col = tl.arange(0, DIM_P2)
    acc = tl.load(part_ptr + ((c * 2 + 1) * DIM_P2)[:, None] + col[None, :],
                  mask=near[:, None], other=0.0)
    heads = tl.load(part_ptr + (((c + 1) * 2) * DIM_P2)[:, None] + col[None, :],
                    mask=near[:, None], other=0.0)
    heads += tl.load(part_ptr + (((c + 2) * 2) * DIM_P2)[:, None] + col[None, :],
                     mask=(near & (end_chunk == c + 2))[:, None], other=0.0)
    _finish_rows(acc + heads, r, near, col, out_ptr, slots_ptr, t_values, dim, row_dim, lr,
                 eps, beta1, beta2, wd, adam_scale, APPLY, OPT, DIM_P2, EVEN)
    far = tail & ~near
    while tl.sum(far.to(tl.int32), 0) > 0:
        pick = lane == tl.min(tl.where(far, lane, CB), 0)
        _finish_far(tl.sum(tl.where(pick, c, 0), 0), tl.sum(tl.where(pick, end_chunk, 0), 0),
                    tl.sum(tl.where(pick, r, 0), 0), col, part_ptr, out_ptr, slots_ptr,
                    t_values, dim, row_dim, lr, eps, beta1, beta2, wd, adam_scale, APPLY, OPT,
                    DIM_P2, EVEN, BK)
        far = far & ~pick


@triton.jit
def _finish_far(c, end_chunk, r, col, part_ptr, out_ptr, slots_ptr, t_values, dim, row_dim, lr,
                eps, beta1, beta2, wd, adam_scale, APPLY: tl.constexpr, OPT: tl.constexpr,
                DIM_P2: tl.constexpr, EVEN: tl.constexpr, BK: tl.constexpr):
    """Finishes the segment ``r`` that leaves chunk ``c`` and ends in chunk ``end_chunk``:
    its tail partial plus the head partials of the chunks after, BK at a time."""
    two = tl.arange(0, 2)
    one = two < 1
    acc = tl.load(part_ptr + ((c * 2 + 1) * DIM_P2 + two * 0)[:, None] + col[None, :],
                  mask=one[:, None], other=0.0)
    k0 = c + 1
    kk = tl.arange(0, BK)
    while k0 <= end_chunk:
        k = k0 + kk
        heads = tl.load(part_ptr + ((k * 2) * DIM_P2)[:, None] + col[None, :],
                        mask=(k <= end_chunk)[:, None], other=0.0)
        acc += tl.sum(heads, axis=0)[None, :]
        k0 += BK
    _finish_rows(acc, r + two * 0, one, col, out_ptr, slots_ptr, t_values, dim, row_dim, lr,
                 eps, beta1, beta2, wd, adam_scale, APPLY, OPT, DIM_P2, EVEN)


# dim is not specialized: a dim divisible by 16 failed to compile (triton 3.6, sm_90);
# EVEN (dim == DIM_P2) makes it a compile-time constant instead.
@fast_launch
@triton.jit(do_not_specialize=["u", "dim"])
def _empty_rows_kernel(row_start_ptr, out_ptr, slots_ptr, t_values, u, dim, row_dim, lr, eps,
                       beta1, beta2, wd, adam_scale, APPLY: tl.constexpr, OPT: tl.constexpr,
                       DIM_P2: tl.constexpr, EVEN: tl.constexpr, BR: tl.constexpr):
    """Unique rows with no position get a zero gradient (written, or applied)."""
    if EVEN:
        dim = DIM_P2
    rows = tl.program_id(0).to(tl.int64) * BR + tl.arange(0, BR)
    rmask = rows < u
    count = (tl.load(row_start_ptr + rows + 1, mask=rmask, other=0)
             - tl.load(row_start_ptr + rows, mask=rmask, other=0))
    col = tl.arange(0, DIM_P2)
    _finish_rows(tl.zeros([BR, DIM_P2], dtype=tl.float32), rows, rmask & (count == 0), col,
                 out_ptr, slots_ptr, t_values, dim, row_dim, lr, eps, beta1, beta2, wd,
                 adam_scale, APPLY, OPT, DIM_P2, EVEN)


def _sorted_rows(row_start: torch.Tensor, n: int) -> torch.Tensor:
    """Unique row of each sorted position: (n,) int64 from the CSR starts (U + 1,)."""
    u = row_start.numel() - 1
    return torch.repeat_interleave(torch.arange(u, device=row_start.device),
                                   row_start[1:] - row_start[:-1], output_size=n)


# Stage-1 tile override: about ``elements`` (sorted positions x columns) per program, at
# least 16 positions, or ``rows`` positions when set (a power of two), on ``num_warps``
# warps; stage 2 sums a long segment's head partials ``heads`` at a time. None keeps the
# defaults (``_reduce_tiles``). Benchmarks may set it.
REDUCE_CONFIG: dict | None = None


def _reduce_tiles(apply: bool, dim_p2: int = 128) -> dict:
    """Stage-1 tiles. The sum alone: 4096 elements a warp, one warp up to 256 columns, so
    a thread holds a column group of every position and the segmented scan runs in its
    registers; on an H200 the layer's SGD backward (10 tables, dim 128, 1M ids) took
    0.407 ms against 0.521 at 2048 elements on 4 warps, the earlier choice (1.28x;
    embedding_layer_gpu_tiles.md). Wider rows (at least 16 positions a chunk) take a
    warp per 4096 elements, so a thread holds no more (not timed). Fused with the
    update, 2048 elements on 4 warps: 4096 on one warp took 5.6 ms with Adam (a
    thread's registers cannot also hold the row's state)."""
    if REDUCE_CONFIG is not None:
        return {"elements": 2048, "rows": 0, "heads": 64, **REDUCE_CONFIG}
    if apply:
        return {"elements": 2048, "rows": 0, "num_warps": 4, "heads": 64}
    tiles = {"elements": 4096, "rows": 0, "num_warps": 1, "heads": 64}
    tiles["num_warps"] = max(1, _chunk_rows(dim_p2, tiles) * dim_p2 // 4096)
    return tiles


def _chunk_rows(dim_p2: int, tiles: dict) -> int:
    """Sorted positions per stage-1 program."""
    return tiles["rows"] or max(16, min(128, tiles["elements"] // dim_p2))


def _launch_reduce(grads: torch.Tensor, gidx: torch.Tensor, weights: torch.Tensor | None,
                   offsets: torch.Tensor | None, order: torch.Tensor, row_start: torch.Tensor,
                   out: torch.Tensor | None, slots: torch.Tensor | None,
                   table_values: torch.Tensor | None, spec, lr: float | None, step: int,
                   sorted_rows: torch.Tensor | None = None,
                   groups: list[int] | None = None, sorted_gidx: bool = False,
                   covered: bool = False) -> None:
    """Two-stage fixed-order reduction: chunks of sorted positions, then the segments
    that cross chunk boundaries. Every addition happens in an order fixed by the
    data layout alone (no atomics), so results do not depend on thread timing, and
    a hot id's positions are spread over many programs. ``groups``: unique-row
    bounds [0, ..., U] of groups whose chunks start afresh; ``sorted_gidx``: ``gidx``
    and ``weights`` are per sorted position; ``covered``: every unique row has a
    position, so no pass for rows without one (``reduce_rows``)."""
    u, n = row_start.numel() - 1, order.numel()
    dim = grads.shape[1]
    if u == 0:
        return
    apply = table_values is not None
    hp = kernel_hyper(spec, lr, step) if apply else KernelHyper(kind=0, lr=0.0)
    dim_p2 = _dim_block(dim)
    even = dim == dim_p2
    tiles = _reduce_tiles(apply, dim_p2)
    ch = _chunk_rows(dim_p2, tiles)
    num_groups = len(groups) - 1 if groups is not None and len(groups) > 2 else 0
    chunks = cdiv(n, ch) + max(0, num_groups - 1)  # a group's last chunk may be short
    # From pinned memory: a pageable source may make the copy wait for the stream.
    bounds = torch.tensor(groups, dtype=torch.int64, pin_memory=grads.is_cuda).to(
        grads.device, non_blocking=True) if num_groups else row_start
    grouping = dict(GROUPS=num_groups > 0, GROUPS_P2=max(2, next_pow2(num_groups)), CH=ch)
    seg = _sorted_rows(row_start, n) if sorted_rows is None else sorted_rows.contiguous()
    part = torch.empty(chunks * 2, dim_p2, dtype=torch.float32, device=grads.device)
    dummy = grads
    target = (out if out is not None else dummy, slots if slots is not None else gidx,
              table_values if apply else dummy)
    scalars = (table_values.shape[1] if apply else dim, hp.lr, hp.eps, hp.beta1, hp.beta2,
               hp.weight_decay, hp.adam_scale)
    row_start = row_start.contiguous()
    if not covered:
        br = max(1, 4096 // dim_p2)
        _empty_rows_kernel[(cdiv(u, br),)](
            row_start, *target, u, dim, *scalars, APPLY=apply, OPT=hp.kind, DIM_P2=dim_p2,
            EVEN=even, BR=br, num_warps=4)
    if n == 0:
        return
    _chunk_kernel[(chunks,)](
        grads.contiguous(), gidx.contiguous(), weights if weights is not None else dummy,
        offsets if offsets is not None else gidx, order.contiguous(), seg,
        row_start, bounds, part, *target, n, num_groups, dim, *scalars,
        HAS_W=weights is not None, MEAN=offsets is not None, SORTED=sorted_gidx,
        APPLY=apply, OPT=hp.kind,
        DIM_P2=dim_p2, EVEN=even, **grouping, num_warps=tiles["num_warps"])
    cb = max(1, 4096 // dim_p2)
    _combine_kernel[(cdiv(chunks, cb),)](
        seg, row_start, bounds, part, *target, n, chunks, num_groups, dim, *scalars,
        APPLY=apply, OPT=hp.kind, DIM_P2=dim_p2, EVEN=even, **grouping, CB=cb,
        BK=tiles["heads"], num_warps=4)


def reduce_rows(grads: torch.Tensor, gidx: torch.Tensor, order: torch.Tensor,
                row_start: torch.Tensor, weights: torch.Tensor | None = None,
                mean_offsets: torch.Tensor | None = None,
                sorted_rows: torch.Tensor | None = None,
                groups: list[int] | None = None, sorted_gidx: bool = False,
                covered: bool = False) -> torch.Tensor:
    """Sums gradient rows per unique id: -> (U, D) float32.

    Position ``p`` of the batch contributes ``grads[gidx[p]] * weights[p]`` (divided
    by its bag's length when ``mean_offsets`` (B + 1,) is given; then ``gidx`` is
    the bag index). ``order`` / ``row_start`` group the positions by unique id;
    ``sorted_rows`` (n,), the unique id of each position in ``order``, saves
    deriving it from ``row_start`` when the caller has it. ``groups``, unique-row
    bounds [0, u_1, ..., U]: each group's rows are summed as if they were reduced
    on their own (its positions start a chunk of their own), bit for bit.
    ``sorted_gidx``: ``gidx`` and ``weights`` are given per position of ``order``
    (entry q for position ``order[q]``): the kernel then reads them in sequence.
    ``covered``: the caller vouches that every unique id has a position (as a dedup's
    grouping does), so rows without one are not zeroed (their rows are undefined).
    """
    out = torch.empty(row_start.numel() - 1, grads.shape[1], dtype=torch.float32,
                      device=grads.device)
    _launch_reduce(grads, gidx, weights, mean_offsets, order, row_start, out, None, None,
                   None, None, 1, sorted_rows, groups, sorted_gidx, covered)
    return out


def reduce_and_apply(grads: torch.Tensor, gidx: torch.Tensor, order: torch.Tensor,
                     row_start: torch.Tensor, slots: torch.Tensor, table_values: torch.Tensor,
                     spec, lr: float | None, step: int, weights: torch.Tensor | None = None,
                     mean_offsets: torch.Tensor | None = None,
                     sorted_rows: torch.Tensor | None = None, sorted_gidx: bool = False) -> None:
    """``reduce_rows`` fused with the sparse optimizer on table rows ``slots`` (U,).

    Unique ids whose slot is -1 (not stored) get no update. ``spec`` is a
    ``hashrec.table.optim`` spec; ``lr`` overrides its rate; ``step`` is 1-based.
    ``sorted_rows`` and ``sorted_gidx`` as in ``reduce_rows``.
    """
    if slots.numel() != row_start.numel() - 1:
        raise ValueError(f"slots has {slots.numel()} entries for {row_start.numel() - 1} ids")
    dim = grads.shape[1]
    if dim + spec.state_dim(dim) != table_values.shape[1]:
        raise ValueError(f"table rows of width {table_values.shape[1]} do not hold dim {dim} "
                         f"+ the state of {type(spec).__name__}")
    _launch_reduce(grads, gidx, weights, mean_offsets, order, row_start, None,
                   slots.contiguous(), table_values, spec, lr, step, sorted_rows,
                   sorted_gidx=sorted_gidx)
