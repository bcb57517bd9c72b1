"""The rows of the fixed-size training lookup (``hashrec.table.fixed_lookup``), each
in one launch over the batch's u unique keys:

* ``finish_rows``: the hits' scores restored to their new values (``protect_hits``
  raised them for the call), the rows of keys placed by the call initialized
  (embedding and optimizer state), and the (u, dim) float32 embeddings read: stored
  rows, the new rows, and the missing keys' initializer value;
* ``expand_rows``: a batch's embeddings from its unique keys' (find_or_insert).

Initial values are computed in the kernel for CONSTANT, UNIFORM with ``key_seed``
(the reference's float64 hash, bit for bit) and UNIFORM / NORMAL from a random
generator (Philox, seeded per call by the table); other initializers come in as a
(u, dim) tensor computed by ``initial_values`` (``init_spec`` picks).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from hashrec.table._triton_hash import load_tags, mix64, tagged_hash
from hashrec.table.initializers import _SEED_STRIDE, initial_values
from hashrec.table.ops.launch import cdiv, fast_launch, next_pow2
from hashrec.table.options import InitializerArgs, InitializerMode
from hashrec.table.storage import TableStorage

# Initial-value modes of finish_rows.
_GIVEN, _CONSTANT, _HASHED_UNIFORM, _RANDOM_UNIFORM, _RANDOM_NORMAL = range(5)


class RowInit(NamedTuple):
    """How ``finish_rows`` computes initial values (see ``init_spec``)."""

    mode: int
    a: float = 0.0
    b: float = 0.0
    seed: int = 0
    given: torch.Tensor | None = None


# Zero embeddings: new rows whose embedding the caller writes next (insert_or_assign).
CONSTANT_ROWS = RowInit(_CONSTANT)


def draws_seed(args: InitializerArgs, n: int, dim: int) -> bool:
    """Whether ``init_spec`` of ``args`` for n keys draws a seed: UNIFORM and NORMAL
    without ``key_seed`` (Philox in the kernel; its offsets are 32-bit)."""
    return (args.mode in (InitializerMode.UNIFORM, InitializerMode.NORMAL)
            and args.key_seed is None and n * dim < 2 ** 31)


def in_kernel(args: InitializerArgs, n: int, dim: int) -> bool:
    """Whether ``finish_rows`` computes ``args``' values for n keys itself (no
    ``initial_values`` tensor computed ahead)."""
    return (args.mode is InitializerMode.CONSTANT or draws_seed(args, n, dim)
            or (args.mode is InitializerMode.UNIFORM and args.key_seed is not None))


def init_spec(args: InitializerArgs, keys: torch.Tensor, tags: torch.Tensor | None, dim: int,
              seed: Callable[[], int], generator: torch.Generator | None) -> RowInit:
    """The kernel form of ``args`` for a batch of u keys; ``seed()`` gives the random
    modes their seed; ``generator`` serves ``initial_values`` for the other modes."""
    mode = args.mode
    if mode is InitializerMode.CONSTANT:
        return RowInit(_CONSTANT, float(args.value))
    if mode is InitializerMode.UNIFORM and args.key_seed is not None:
        return RowInit(_HASHED_UNIFORM, args.upper - args.lower, args.lower,
                       args.key_seed * _SEED_STRIDE & ((1 << 63) - 1))
    if draws_seed(args, keys.numel(), dim):
        if mode is InitializerMode.UNIFORM:
            return RowInit(_RANDOM_UNIFORM, args.upper - args.lower, args.lower, seed())
        return RowInit(_RANDOM_NORMAL, args.std_dev, args.mean, seed())
    return RowInit(_GIVEN, given=initial_values(args, keys, tags, dim, torch.float32, generator))


@triton.jit
def _initial(MODE: tl.constexpr, given_ptr, i, col, valid, key, tag, a, b, seed,
             DIM: tl.constexpr, BLOCK: tl.constexpr, COLS: tl.constexpr):
    """Initial values (BLOCK, COLS) float32 of the keys at batch rows ``i`` (see RowInit)."""
    emb = valid[:, None] & (col[None, :] < DIM)
    if MODE == 0:
        out = tl.load(given_ptr + i[:, None] * DIM + col[None, :], mask=emb, other=0.0)
    elif MODE == 1:
        out = tl.zeros([BLOCK, COLS], dtype=tl.float32) + a
    elif MODE == 2:
        base = mix64(tagged_hash(key, tag) ^ seed.to(tl.uint64))
        # Column c mixes in (c + 1) * 0x9E3779B97F4A7C15, as ``hashed_uniforms``.
        step = (col + 1).to(tl.uint64) * 0x9E3779B97F4A7C15
        bits = mix64(base[:, None] + step[None, :])
        u = ((bits >> 11).to(tl.int64).to(tl.float64) + 0.5) * (1.0 / 9007199254740992.0)
        out = (u * a + b).to(tl.float32)
    else:
        offset = (i[:, None] * DIM + col[None, :]).to(tl.int32)
        if MODE == 3:
            out = tl.rand(seed, offset) * a + b
        else:
            out = tl.randn(seed, offset) * a + b
    return out


@triton.jit
def _program_work(slots_ptr, placed_ptr, hit_ptr, hit_scores_ptr, t_scores, active_ptr,
                  guard_ptr, base, n, WRITES: tl.constexpr, GUARDED: tl.constexpr,
                  HAS_STATE: tl.constexpr, HAS_ACTIVE: tl.constexpr, STORED: tl.constexpr,
                  EMBED: tl.constexpr, BLOCK: tl.constexpr):
    """``_finish_kernel``'s first pass over its BLOCK keys (slots at once): the hits' new
    scores restored (WRITES; with GUARDED, only after an insert protected them), and the
    keys the tiles then cover: BLOCK, or (without STORED) 0 where no row is to be written
    (every key stored, or inactive)."""
    k = base + tl.arange(0, BLOCK)
    in_range = k < n
    if WRITES or not STORED:
        k_slot = tl.load(slots_ptr + k, mask=in_range, other=-1)
    if WRITES:
        restore = in_range & (k_slot >= 0) & \
            (tl.load(hit_ptr + k, mask=in_range, other=0) != 0)
        if GUARDED:
            restore = restore & (tl.load(guard_ptr) != 0)
        tl.store(t_scores + k_slot, tl.load(hit_scores_ptr + k, mask=restore, other=0),
                 mask=restore)
    work = BLOCK
    if not STORED:
        if EMBED:
            todo = in_range & (k_slot < 0)
            if HAS_ACTIVE:
                todo = todo & (tl.load(active_ptr + k, mask=in_range, other=0) != 0)
        else:  # no row read: only placed rows' state columns to write
            todo = in_range & (k_slot < -1)
        if WRITES and (EMBED or HAS_STATE):
            todo = todo | (in_range & (k_slot >= 0) &
                           (tl.load(placed_ptr + k, mask=in_range, other=0) != 0))
        work = BLOCK * tl.minimum(tl.max(todo.to(tl.int32), axis=0), 1)
    return work


@triton.jit
def _write_placed(values, state_ptr, new_given, i, col, slot, placed, key, tag, new_a, new_b,
                  new_seed, row, HAS_STATE: tl.constexpr, EMBED: tl.constexpr,
                  NEW_MODE: tl.constexpr, DIM: tl.constexpr, ROW_DIM: tl.constexpr,
                  COLS: tl.constexpr, SUB: tl.constexpr):
    """The rows of the ``placed`` keys of a (SUB, COLS) tile written: their initial
    embedding (EMBED), which they also read (``row`` returned), and the state columns
    [DIM, ROW_DIM) from ``state_ptr``, COLS at a time (HAS_STATE)."""
    if EMBED:
        new = _initial(NEW_MODE, new_given, i, col, placed, key, tag, new_a, new_b, new_seed,
                       DIM, SUB, COLS).to(values.dtype.element_ty)
        tl.store(values + slot[:, None] * ROW_DIM + col[None, :], new,
                 mask=placed[:, None] & (col[None, :] < DIM))
        row = tl.where(placed[:, None], new.to(tl.float32), row)
    if HAS_STATE:
        for start in tl.static_range(DIM, ROW_DIM, COLS):
            at = start + col
            state = tl.load(state_ptr + at - DIM, mask=at < ROW_DIM, other=0)
            tl.store(values + slot[:, None] * ROW_DIM + at[None, :],
                     tl.zeros([SUB, COLS], dtype=values.dtype.element_ty) + state[None, :],
                     mask=placed[:, None] & (at[None, :] < ROW_DIM))
    return row


@triton.jit
def _store_out(out_ptr, out_at_ptr, i, col, row, written, OUT_AT: tl.constexpr,
               DIM: tl.constexpr):
    """A tile's embeddings (rows ``i``, where ``written``) into the (u, DIM) output.
    OUT_AT: the output's row count and address are read when the kernel runs (a
    captured call's), not passed at launch."""
    into = out_ptr
    if OUT_AT:
        # 16-byte aligned, as every tensor the allocator hands out: stores vectorize
        into = tl.multiple_of(tl.load(out_at_ptr + 1).to(tl.pointer_type(tl.float32)), 16)
        written = written & (i < tl.load(out_at_ptr))
    tl.store(into + i[:, None] * DIM + col[None, :], row,
             mask=written[:, None] & (col[None, :] < DIM))


@fast_launch
@triton.jit(do_not_specialize=["n", "new_seed", "miss_seed"])
def _finish_kernel(keys_ptr, tags_ptr, slots_ptr, placed_ptr, hit_ptr, hit_scores_ptr, values,
                   t_scores, state_ptr, out_ptr, new_given, miss_given, active_ptr, out_at_ptr,
                   guard_ptr, n, new_a, new_b, new_seed, miss_a, miss_b, miss_seed, seeds_ptr,
                   HAS_TAGS: tl.constexpr, SEEDS_IN_MEMORY: tl.constexpr, WRITES: tl.constexpr,
                   GUARDED: tl.constexpr, HAS_STATE: tl.constexpr, HAS_ACTIVE: tl.constexpr,
                   OUT_AT: tl.constexpr, STORED: tl.constexpr, EMBED: tl.constexpr,
                   NEW_MODE: tl.constexpr,
                   MISS_MODE: tl.constexpr, DIM: tl.constexpr, ROW_DIM: tl.constexpr,
                   COLS: tl.constexpr, SUB: tl.constexpr, BLOCK: tl.constexpr):
    """BLOCK keys a program: the hits' scores restored in one pass over them, then their
    rows in (SUB, COLS) tiles, COLS the embedding's width rounded up to a power of two.
    The state columns past it (an optimizer's) are written, COLS at a time, only for
    rows this call placed, so a row of Adam state (three times the embedding) does not
    widen the tile every key reads its embedding through. Against whole-row tiles, the
    layer forward of Adam rows with the dedup ahead took 0.97 ms against 1.07
    (embedding_layer_gpu_finish_tiles_first.md, _before_finish_tiles.md). Without
    STORED, a program whose keys are all stored (or inactive) skips the tiles after one
    look at its flags: a warm table's all-hit lookup (not yet timed). Without EMBED
    (with WRITES, not STORED) no embedding is written or read: placed rows get their
    state columns alone, and a program with none to write skips the tiles."""
    base = tl.program_id(0).to(tl.int64) * BLOCK
    if SEEDS_IN_MEMORY:  # random modes' seeds (missing, new), written before a graph replay
        # As 32-bit values, as a launch passes the host's seeds (below 2**31, the table's
        # ``_kernel_seed``): Philox from a 64-bit seed took this kernel 187 registers a
        # thread against 96 at dim 128 (sm_90), and 0.55 ms against 0.48 in find_or_insert.
        if MISS_MODE >= 3:
            miss_seed = tl.load(seeds_ptr).to(tl.int32)
        if NEW_MODE >= 3:
            new_seed = tl.load(seeds_ptr + 1).to(tl.int32)
    work = _program_work(slots_ptr, placed_ptr, hit_ptr, hit_scores_ptr, t_scores, active_ptr,
                         guard_ptr, base, n, WRITES, GUARDED, HAS_STATE, HAS_ACTIVE, STORED,
                         EMBED, BLOCK)
    col = tl.arange(0, COLS)
    emb = col[None, :] < DIM
    sub = 0
    while sub < work:
        i = base + sub + tl.arange(0, SUB)
        mask = i < n
        slot = tl.load(slots_ptr + i, mask=mask, other=-1)
        missing = mask & (slot < 0)
        if HAS_ACTIVE:  # inactive keys (slot -1) read a zero row
            missing = missing & (tl.load(active_ptr + i, mask=mask, other=0) != 0)
        if WRITES:
            placed = mask & (slot >= 0) & (tl.load(placed_ptr + i, mask=mask, other=0) != 0)
        else:
            placed = mask & (slot < -1)  # no key: nothing is written
        stored = mask & (slot >= 0) & ~placed
        fresh = placed | missing
        # Tiles with no row to write are skipped: with stored rows left to the caller
        # (STORED False) that is nearly every tile of a warm table (in the layer's forward
        # on an H200, 29 us against 44: embedding_layer_gpu_trace.txt, _tiles_trace.txt).
        if EMBED:
            needed = mask if STORED else mask & ~stored
        else:
            needed = placed
        if tl.max(needed.to(tl.int32), axis=0) > 0:
            key = tl.load(keys_ptr + i, mask=fresh, other=0)
            tag = load_tags(tags_ptr, i, fresh, HAS_TAGS)
            if STORED:
                row = tl.load(values + slot[:, None] * ROW_DIM + col[None, :],
                              mask=stored[:, None] & emb, other=0.0).to(tl.float32)
            else:  # the caller reads stored rows from the table itself
                row = tl.zeros([SUB, COLS], dtype=tl.float32)
            # Initial values only in tiles that have such keys: once a table is warm nearly
            # every key is stored, and a random initializer costs tens of operations a value.
            if WRITES:
                if tl.max(placed.to(tl.int32), axis=0) > 0:
                    row = _write_placed(values, state_ptr, new_given, i, col, slot, placed,
                                        key, tag, new_a, new_b, new_seed, row, HAS_STATE,
                                        EMBED, NEW_MODE, DIM, ROW_DIM, COLS, SUB)
            if EMBED and tl.max(missing.to(tl.int32), axis=0) > 0:
                miss = _initial(MISS_MODE, miss_given, i, col, missing, key, tag, miss_a,
                                miss_b, miss_seed, DIM, SUB, COLS)
                row = tl.where(missing[:, None], miss, row)
            if EMBED:
                _store_out(out_ptr, out_at_ptr, i, col, row, needed, OUT_AT, DIM)
        sub += SUB


# The finish launch: row tiles of about ``elements`` (keys x embedding columns), on
# ``num_warps`` warps, and ``keys`` keys a program (at least a tile; by default
# _FINISH_KEYS); None keeps the default (4096 on 4). Benchmarks may set it.
FINISH_CONFIG: dict | None = None
_FINISH_KEYS = 256


def finish_rows(storage: TableStorage, keys: torch.Tensor, tags: torch.Tensor | None,
                slots: torch.Tensor, dim: int, missing: RowInit, new: RowInit | None = None,
                placed: torch.Tensor | None = None, hit: torch.Tensor | None = None,
                hit_scores: torch.Tensor | None = None,
                state: torch.Tensor | None = None,
                seeds: torch.Tensor | None = None,
                active: torch.Tensor | None = None,
                out_at: torch.Tensor | None = None,
                stored_rows: bool = True,
                guard: torch.Tensor | None = None,
                embeddings: bool = True) -> torch.Tensor | None:
    """Embeddings (u, dim) float32 of the keys at ``slots`` (-1: read ``missing``).

    With ``new`` (a training lookup), also in the same launch: the rows of ``placed``
    (u,) bool keys get ``new`` initial values (stored in the table's dtype, and read
    back as stored) and ``state`` (row_dim - dim,) in the optimizer columns; the
    scores of ``hit`` (u,) bool keys become ``hit_scores``.

    ``seeds`` (2,) int64 on the device, when given, replaces the seeds of ``missing``
    and ``new`` (in that order) where their mode is random: the kernel reads them
    when it runs, so a captured launch takes new seeds at every replay.

    ``active`` (u,) bool: keys outside it (their slot must be -1) read a zero row
    instead of ``missing``.

    ``out_at`` (2,) int64 on the device, when given: [m, address]; the embeddings of
    the first m keys go to the (m, dim) float32 tensor at that address, read when the
    kernel runs (a captured launch writes each replay's rows into a new tensor), and
    None is returned.

    ``stored_rows`` False: the rows of keys stored before the call (slot >= 0, not
    placed by it) are neither read nor written, so theirs in the result are undefined;
    a caller that reads them from the table by slot saves moving each row twice.

    ``guard`` (0-d bool on the device; ``protect_hits``'): when False as the kernel
    runs, the hits' scores are left as they are (``protect_hits`` then wrote them).

    ``embeddings`` False (with ``new``; insert_or_assign, whose caller writes the
    embeddings next): the placed rows get their state columns alone, no embedding is
    read or written, and None is returned. On an H200 the constant embeddings written
    and then overwritten took 0.22 ms of a 1M-key call at dim 128
    (``benchmarks/results/table_api_gpu.md``).
    """
    if not embeddings and new is None:
        raise ValueError("finish_rows: embeddings=False needs new rows to finish")
    n, row_dim = keys.numel(), storage.row_dim
    bare = out_at is not None or not embeddings
    out = torch.empty(0 if bare else n, dim, dtype=torch.float32, device=keys.device)
    if n == 0:
        return None if bare else out
    writes = new is not None
    new = new or RowInit(_CONSTANT)
    cols = next_pow2(dim)
    config = FINISH_CONFIG or {"elements": 4096, "num_warps": 4}
    sub = max(1, min(64, config["elements"] // cols))
    block = max(sub, config.get("keys", _FINISH_KEYS))
    flags = (placed.view(torch.int8), hit.view(torch.int8), hit_scores) if writes else (
        slots, slots, slots)
    _finish_kernel[(cdiv(n, block),)](
        keys, tags if tags is not None else keys, slots, *flags, storage.values, storage.scores,
        state if state is not None else out, out,
        new.given if new.given is not None else out,
        missing.given if missing.given is not None else out,
        active.view(torch.int8) if active is not None else slots,
        out_at if out_at is not None else slots,
        guard.view(torch.int8) if guard is not None else slots, n, float(new.a),
        float(new.b), int(new.seed), float(missing.a), float(missing.b), int(missing.seed),
        seeds if seeds is not None else out, HAS_TAGS=tags is not None,
        SEEDS_IN_MEMORY=seeds is not None, WRITES=writes, GUARDED=guard is not None,
        HAS_STATE=state is not None,
        HAS_ACTIVE=active is not None, OUT_AT=out_at is not None,
        STORED=stored_rows and embeddings, EMBED=embeddings,
        NEW_MODE=new.mode, MISS_MODE=missing.mode, DIM=dim, ROW_DIM=row_dim, COLS=cols,
        SUB=sub, BLOCK=block, num_warps=config["num_warps"])
    return None if bare else out


@fast_launch
@triton.jit(do_not_specialize=["n"])
def _expand_kernel(inverse_ptr, slots_ptr, found_ptr, values, rows_ptr, out_ptr, out_found, n,
                   DIM: tl.constexpr, ROW_DIM: tl.constexpr, COLS: tl.constexpr,
                   BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    u = tl.load(inverse_ptr + i, mask=mask, other=0)
    found = mask & (tl.load(found_ptr + u, mask=mask, other=0) != 0)
    tl.store(out_found + i, found.to(tl.int8), mask=mask)
    slot = tl.load(slots_ptr + u, mask=found, other=0)
    col = tl.arange(0, COLS)
    emb = col[None, :] < DIM
    stored = tl.load(values + slot[:, None] * ROW_DIM + col[None, :],
                     mask=found[:, None] & emb, other=0.0).to(tl.float32)
    fresh = mask & ~found
    row = tl.load(rows_ptr + u[:, None] * DIM + col[None, :], mask=fresh[:, None] & emb,
                  other=0.0)
    tl.store(out_ptr + i[:, None] * DIM + col[None, :], tl.where(found[:, None], stored, row),
             mask=mask[:, None] & emb)


def expand_rows(storage: TableStorage, slots: torch.Tensor, found: torch.Tensor,
                rows: torch.Tensor, inverse: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Embeddings (n, dim) float32 of a batch from its unique keys' lookup, and which
    batch keys were found (n,) bool, in one launch: batch key i is unique key
    ``inverse[i]``, which reads its stored row (at ``slots``, where ``found``: stored
    before the call) or else its row of ``rows`` (u, dim) float32 (``finish_rows``
    with ``stored_rows`` False: new rows and initializer values). Against finish_rows
    reading every row and a gather of them by ``inverse``, each stored row moves once
    instead of three times."""
    n, dim = inverse.numel(), rows.shape[1]
    out = torch.empty(n, dim, dtype=torch.float32, device=inverse.device)
    out_found = torch.empty(n, dtype=torch.bool, device=inverse.device)
    if n == 0:
        return out, out_found
    cols = next_pow2(dim)
    block = max(1, min(256, 4096 // cols))
    _expand_kernel[(cdiv(n, block),)](
        inverse, slots, found.view(torch.int8), storage.values, rows, out,
        out_found.view(torch.int8), n, DIM=dim, ROW_DIM=storage.row_dim, COLS=cols,
        BLOCK=block, num_warps=4)
    return out, out_found


__all__ = ["CONSTANT_ROWS", "RowInit", "draws_seed", "expand_rows", "finish_rows", "in_kernel",
           "init_spec"]
