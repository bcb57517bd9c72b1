"""Triton routing with the reference's signature (see ``reference.py``).

A stable counting sort by owner in two passes over the keys. The first counts each
block's keys per owner, owner-major, so that one cumulative sum gives every
(owner, block) its place; the second places each key at its owner's place for its
block plus its rank among the block's keys of that owner, and writes the key, its
integers and its position there. Two launches and a sum, where the reference
takes a hash of about ten operators, a sort, a count, a stack and a gather.
``owner_counts`` is the first pass over marked keys, its block sums added up atomically.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hashrec.distributed.ops.route import reference
from hashrec.table._triton_hash import mix64
from hashrec.table.ops.launch import cdiv, fast_launch, next_pow2

_BLOCK = 1024
# Larger worlds take the reference (the per-block owner tile grows with the world).
_MAX_WORLD = 64


@triton.jit
def _owners(keys_ptr, offs, mask, world):
    """Owning rank of each key: bits 32..62 of mix64(key), modulo the world size."""
    key = tl.load(keys_ptr + offs, mask=mask, other=0)
    h = mix64(key.to(tl.uint64, bitcast=True))
    return ((h >> 32) & 0x7FFFFFFF).to(tl.int64) % world, key


@fast_launch
@triton.jit(do_not_specialize=["n", "blocks"])
def _count_kernel(keys_ptr, marks_ptr, counts_ptr, n, world, blocks,
                  MARKED: tl.constexpr, TOTAL: tl.constexpr,
                  BLOCK: tl.constexpr, WORLD: tl.constexpr):
    """Keys per owner of each block (``MARKED``: only where ``marks`` is set): stored
    owner-major, one cell per (owner, block), or with ``TOTAL`` added up in
    ``counts[owner]`` (integer adds: the total does not depend on the blocks' order)."""
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    owner, _ = _owners(keys_ptr, offs, mask, world)
    if MARKED:
        mask = mask & (tl.load(marks_ptr + offs, mask=mask, other=0) != 0)
    ranks = tl.arange(0, WORLD)
    per_owner = tl.sum(((owner[:, None] == ranks[None, :]) & mask[:, None]).to(tl.int64), axis=0)
    if TOTAL:
        tl.atomic_add(counts_ptr + ranks, per_owner, mask=ranks < world)
    else:
        tl.store(counts_ptr + ranks * blocks + pid, per_owner, mask=ranks < world)


@fast_launch
@triton.jit(do_not_specialize=["n", "blocks"])
def _place_kernel(keys_ptr, first_ptr, second_ptr, third_ptr, block_counts_ptr, ends_ptr,
                  order_ptr, columns_ptr, n, world, blocks,
                  EXTRAS: tl.constexpr, BLOCK: tl.constexpr, WORLD: tl.constexpr):
    pid = tl.program_id(0)
    offs = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    owner, key = _owners(keys_ptr, offs, mask, world)
    hits = ((owner[:, None] == tl.arange(0, WORLD)[None, :]) & mask[:, None]).to(tl.int32)
    # Rank of each key among the block's keys of its owner, in position order.
    rank = tl.sum(tl.cumsum(hits, axis=0) * hits, axis=1) - 1
    cell = owner * blocks + pid
    start = tl.load(ends_ptr + cell, mask=mask, other=0) - \
        tl.load(block_counts_ptr + cell, mask=mask, other=0)
    dest = start + rank
    tl.store(order_ptr + dest, offs, mask=mask)
    row = columns_ptr + dest * (1 + EXTRAS)
    tl.store(row, key, mask=mask)
    if EXTRAS > 0:
        tl.store(row + 1, tl.load(first_ptr + offs, mask=mask, other=0).to(tl.int64), mask=mask)
    if EXTRAS > 1:
        tl.store(row + 2, tl.load(second_ptr + offs, mask=mask, other=0).to(tl.int64),
                 mask=mask)
    if EXTRAS > 2:
        tl.store(row + 3, tl.load(third_ptr + offs, mask=mask, other=0).to(tl.int64), mask=mask)


def route_columns(keys: torch.Tensor, extras: list[torch.Tensor], world_size: int,
                  send_counts: bool = True
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """See ``reference.route_columns``."""
    n = keys.numel()
    if n == 0 or world_size > _MAX_WORLD or len(extras) > 3:
        return reference.route_columns(keys, extras, world_size, send_counts)
    blocks, world = cdiv(n, _BLOCK), max(2, next_pow2(world_size))
    keys = keys.contiguous()
    block_counts = torch.empty(world_size * blocks, dtype=torch.int64, device=keys.device)
    _count_kernel[(blocks,)](keys, keys, block_counts, n, world_size, blocks, MARKED=False,
                             TOTAL=False, BLOCK=_BLOCK, WORLD=world)
    ends = torch.cumsum(block_counts, 0)  # owner-major: (owner, block) ends its place
    order = torch.empty(n, dtype=torch.int64, device=keys.device)
    columns = torch.empty((n, 1 + len(extras)), dtype=torch.int64, device=keys.device)
    given = [e.contiguous() for e in extras] + [keys] * (3 - len(extras))
    _place_kernel[(blocks,)](keys, *given, block_counts, ends, order, columns, n, world_size,
                             blocks, EXTRAS=len(extras), BLOCK=_BLOCK, WORLD=world)
    if not send_counts:
        return order, columns, None
    totals = ends.view(world_size, blocks)[:, -1]
    return order, columns, torch.cat([totals[:1], totals[1:] - totals[:-1]])


def owner_counts(keys: torch.Tensor, mask: torch.Tensor, world_size: int) -> torch.Tensor:
    """See ``reference.owner_counts``."""
    n = keys.numel()
    if n == 0 or world_size > _MAX_WORLD:
        return reference.owner_counts(keys, mask, world_size)
    blocks = cdiv(n, _BLOCK)
    out = torch.zeros(world_size, dtype=torch.int64, device=keys.device)
    _count_kernel[(blocks,)](keys.contiguous(), mask.contiguous(), out, n, world_size, blocks,
                             MARKED=True, TOTAL=True, BLOCK=_BLOCK,
                             WORLD=max(2, next_pow2(world_size)))
    return out
