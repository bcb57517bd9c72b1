"""Row kernels of the CUDA write paths: store given rows, or read rows and initialize
the new ones, each in one launch.

``write_rows`` stores caller rows at slots (insert_or_assign); ``assign_rows`` stores
a row's leading columns, picked through an index, and its score
(``HashTable.insert_or_assign`` / ``load_state``). ``read_or_init_rows``
serves find_or_insert: every key reads its stored embedding, except keys whose
slot this call created (and refused keys), which read an initial embedding drawn
in-kernel from a counter-based hash of (seed, key, tag, column) (``init_uniforms``
is the same function in PyTorch); the first occurrence
of each created key also writes that embedding (plus the optimizer-state value
in the remaining columns) to its row. Repeats of a key compute the same values,
so no program waits for another.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hashrec.table._triton_hash import load_tags, mix64, tagged_hash
from hashrec.table.hashing import mix64 as torch_mix64
from hashrec.table.hashing import mix_tagged
from hashrec.table.initializers import _SEED_STRIDE
from hashrec.table.ops.launch import cdiv, env_int, fast_launch, next_pow2

# The row kernels' launch: elements (rows x padded columns) a program and its warps.
# ``read_or_init_rows`` has its own ("init_") for rows of ``init_columns`` padded columns
# or more: smaller programs there read and initialize rows of 32 to 128 columns faster,
# and rows of 8 slower (benchmarks/results/read_or_init_launch.md). Benchmarks sweep
# them (HASHREC_ROWS_ELEMENTS, HASHREC_ROWS_WARPS, HASHREC_ROWS_INIT_ELEMENTS,
# HASHREC_ROWS_INIT_WARPS).
ROWS_LAUNCH = {"elements": env_int("HASHREC_ROWS_ELEMENTS", 4096),
               "num_warps": env_int("HASHREC_ROWS_WARPS", 4),
               "init_elements": env_int("HASHREC_ROWS_INIT_ELEMENTS", 1024),
               "init_warps": env_int("HASHREC_ROWS_INIT_WARPS", 2),
               "init_columns": 32}


@fast_launch
@triton.jit(do_not_specialize=["n"])
def _write_rows_kernel(values, slots_ptr, mask_ptr, src_ptr, n, HAS_MASK: tl.constexpr,
                       ROW_DIM: tl.constexpr, ROW_P2: tl.constexpr, BLOCK: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    rmask = rows < n
    slot = tl.load(slots_ptr + rows, mask=rmask, other=-1)
    rmask = rmask & (slot >= 0)
    if HAS_MASK:
        rmask = rmask & (tl.load(mask_ptr + rows, mask=rmask, other=0) != 0)
    col = tl.arange(0, ROW_P2)
    m2 = rmask[:, None] & (col[None, :] < ROW_DIM)
    x = tl.load(src_ptr + rows[:, None] * ROW_DIM + col[None, :], mask=m2, other=0.0)
    tl.store(values + slot[:, None] * ROW_DIM + col[None, :], x, mask=m2)


def write_rows(values: torch.Tensor, slots: torch.Tensor, mask: torch.Tensor | None,
               rows: torch.Tensor) -> None:
    """values[slots[i]] = rows[i] where slots[i] >= 0 (and mask[i], when given), in one launch.

    values (R, row_dim), slots (n,) int64, mask (n,) bool or None, rows (n, row_dim).
    With repeated slots among the written ones, which row lands is not specified:
    pass a mask that selects each slot once (``UpsertResult.inserted`` does).
    """
    n, row_dim = slots.numel(), values.shape[1]
    if rows.shape != (n, row_dim) or not values.is_contiguous():
        raise ValueError(f"rows must be ({n}, {row_dim}) and values contiguous, got rows "
                         f"{tuple(rows.shape)}")
    if n == 0:
        return
    row_p2 = next_pow2(row_dim)
    block = max(1, min(ROWS_LAUNCH["elements"] // 32, ROWS_LAUNCH["elements"] // row_p2))
    mask_arg = mask.contiguous().view(torch.uint8) if mask is not None else slots
    _write_rows_kernel[(cdiv(n, block),)](
        values, slots.contiguous(), mask_arg, rows.to(values.dtype).contiguous(), n,
        HAS_MASK=mask is not None, ROW_DIM=row_dim, ROW_P2=row_p2, BLOCK=block,
        num_warps=ROWS_LAUNCH["num_warps"])


@fast_launch
@triton.jit(do_not_specialize=["n"])
def _assign_rows_kernel(values, t_scores, slots_ptr, src_ptr, source_ptr, scores_ptr, n,
                        HAS_SOURCE: tl.constexpr, HAS_SCORES: tl.constexpr,
                        ROW_DIM: tl.constexpr, W: tl.constexpr, W_P2: tl.constexpr,
                        BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    slot = tl.load(slots_ptr + i, mask=i < n, other=-1)
    keep = slot >= 0
    at = i
    if HAS_SOURCE:
        at = tl.load(source_ptr + i, mask=keep, other=0)
    col = tl.arange(0, W_P2)
    m2 = keep[:, None] & (col[None, :] < W)
    x = tl.load(src_ptr + at[:, None] * W + col[None, :], mask=m2, other=0.0)
    tl.store(values + slot[:, None] * ROW_DIM + col[None, :], x, mask=m2)
    if HAS_SCORES:
        tl.store(t_scores + slot, tl.load(scores_ptr + at, mask=keep, other=0), mask=keep)


def assign_rows(values: torch.Tensor, slots: torch.Tensor, rows: torch.Tensor,
                source: torch.Tensor | None = None, scores: torch.Tensor | None = None,
                table_scores: torch.Tensor | None = None) -> None:
    """values[slots[i], :w] = rows[source[i]] where slots[i] >= 0, in one launch, no
    host read (insert_or_assign's rows, ``load_state``'s full rows).

    values (R, row_dim), slots (u,) int64 (unique where >= 0), rows (m, w) with w <=
    row_dim, source (u,) int64 row of each slot (None: row i); with ``scores`` (m,)
    int64, also table_scores[slots[i]] = scores[source[i]].
    """
    u, (m, w), row_dim = slots.numel(), rows.shape, values.shape[1]
    if w > row_dim or not values.is_contiguous() or (source is None and m != u):
        raise ValueError(f"rows ({m}, {w}) do not fit {u} slots of rows of {row_dim}")
    if (scores is None) != (table_scores is None):
        raise ValueError("scores and table_scores come together")
    if u == 0:
        return
    w_p2 = next_pow2(w)
    block = max(1, min(ROWS_LAUNCH["elements"] // 32, ROWS_LAUNCH["elements"] // w_p2))
    _assign_rows_kernel[(cdiv(u, block),)](
        values, table_scores if table_scores is not None else slots, slots.contiguous(),
        rows.to(values.dtype).contiguous(),
        source.contiguous() if source is not None else slots,
        scores.contiguous() if scores is not None else slots, u,
        HAS_SOURCE=source is not None, HAS_SCORES=scores is not None, ROW_DIM=row_dim, W=w,
        W_P2=w_p2, BLOCK=block, num_warps=ROWS_LAUNCH["num_warps"])


@triton.jit
def _hashed_uniform(key, tag, col, seed_mix):
    """Uniforms in (0, 1) of (key, tag) at 0-based columns ``col``: (BLOCK, COLS) float32."""
    base = mix64(tagged_hash(key, tag) ^ seed_mix) & 0xFFFFFFFF
    x = base.to(tl.uint32)[:, None] ^ ((col + 1).to(tl.uint32) * 0x9E3779B9)[None, :]
    x = x ^ (x >> 16)
    x = x * 0x85EBCA6B
    x = x ^ (x >> 13)
    x = x * 0xC2B2AE35
    x = x ^ (x >> 16)
    return ((x >> 8).to(tl.float32) + 0.5) * (1.0 / 16777216.0)


def init_uniforms(keys: torch.Tensor, tags: torch.Tensor | None, dim: int,
                  seed: int) -> torch.Tensor:
    """The uniforms ``read_or_init_rows`` draws, in PyTorch: (n,) int64 -> (n, dim) float32.

    A pure function of (seed, key, tag, column): the row hash ``mix64(mix_tagged(key,
    tag) ^ seed')`` keeps its low 32 bits, each column mixes them with ``(column + 1) *
    0x9E3779B9`` through the murmur3 32-bit finalizer, and the top 24 bits give u.
    """
    low = (1 << 32) - 1
    base = torch_mix64(mix_tagged(keys, tags) ^ _seed_mix(seed)) & low
    cols = torch.arange(1, dim + 1, dtype=torch.int64, device=keys.device) * 0x9E3779B9 & low
    x = base[:, None] ^ cols[None, :]
    x = x ^ (x >> 16)
    x = x * 0x85EBCA6B & low
    x = x ^ (x >> 13)
    x = x * 0xC2B2AE35 & low
    x = x ^ (x >> 16)
    return ((x >> 8).to(torch.float32) + 0.5) * (1.0 / 16777216.0)


def _seed_mix(seed: int) -> int:
    return seed * _SEED_STRIDE & ((1 << 63) - 1)


@fast_launch
@triton.jit(do_not_specialize=["n", "seed_mix"])
def _read_or_init_kernel(keys_ptr, tags_ptr, slots_ptr, created_ptr, inserted_ptr, values, out,
                         n, seed_mix, lower, upper, state, HAS_TAGS: tl.constexpr,
                         DIM: tl.constexpr, ROW_DIM: tl.constexpr, ROW_P2: tl.constexpr,
                         BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    slot = tl.load(slots_ptr + i, mask=mask, other=-1)
    fresh = mask & ((slot < 0) | (tl.load(created_ptr + i, mask=mask, other=0) != 0))
    write = fresh & (slot >= 0) & (tl.load(inserted_ptr + i, mask=mask, other=0) != 0)
    col = tl.arange(0, ROW_P2)
    emb = col[None, :] < DIM
    row = tl.load(values + slot[:, None] * ROW_DIM + col[None, :],
                  mask=(mask & ~fresh & (slot >= 0))[:, None] & emb, other=0.0)
    if tl.max(fresh.to(tl.int32), axis=0) > 0:  # initial values only where a key needs them
        key = tl.load(keys_ptr + i, mask=fresh, other=0)
        tag = load_tags(tags_ptr, i, fresh, HAS_TAGS)
        u = _hashed_uniform(key, tag, col, seed_mix.to(tl.int64).to(tl.uint64, bitcast=True))
        init = tl.where(emb, u * (upper - lower) + lower, state).to(values.dtype.element_ty)
        row = tl.where(fresh[:, None], init, row)
        tl.store(values + slot[:, None] * ROW_DIM + col[None, :], init,
                 mask=write[:, None] & (col[None, :] < ROW_DIM))
    tl.store(out + i[:, None] * DIM + col[None, :], row.to(tl.float32), mask=mask[:, None] & emb)


def read_or_init_rows(values: torch.Tensor, keys: torch.Tensor, tags: torch.Tensor | None,
                      slots: torch.Tensor, created: torch.Tensor, inserted: torch.Tensor,
                      dim: int, lower: float, upper: float, seed: int,
                      state: float = 0.0) -> torch.Tensor:
    """Embeddings (n, dim) float32 of an upserted batch, new rows initialized, one launch.

    Args:
        values: (R, row_dim) value rows of the table.
        keys, tags: the batch (n,) int64 and (n,) int32 | None.
        slots, created, inserted: ``UpsertResult`` fields of the batch.
        dim: embedding columns; columns [dim, row_dim) of new rows are set to ``state``.
        lower, upper, seed: new and refused keys read ``lower + (upper - lower) * u``
            with u = ``init_uniforms(key, tag, seed)``.
    """
    n, row_dim = keys.numel(), values.shape[1]
    if not 0 < dim <= row_dim or not values.is_contiguous():
        raise ValueError(f"dim={dim} must be in [1, row_dim={row_dim}] and values contiguous")
    out = torch.empty(n, dim, dtype=torch.float32, device=keys.device)
    if n == 0:
        return out
    row_p2 = next_pow2(row_dim)
    wide = row_p2 >= ROWS_LAUNCH["init_columns"]
    elements, warps = ((ROWS_LAUNCH["init_elements"], ROWS_LAUNCH["init_warps"]) if wide
                       else (ROWS_LAUNCH["elements"], ROWS_LAUNCH["num_warps"]))
    block = max(1, min(elements // 64, elements // row_p2))
    _read_or_init_kernel[(cdiv(n, block),)](
        keys, tags if tags is not None else keys, slots, created.view(torch.uint8),
        inserted.view(torch.uint8), values, out, n, _seed_mix(seed), float(lower), float(upper),
        float(state), HAS_TAGS=tags is not None, DIM=dim, ROW_DIM=row_dim, ROW_P2=row_p2,
        BLOCK=block, num_warps=warps)
    return out

