"""Triton dedup ops with the reference's signatures (see ``reference.py``).

``tag_summary``: one program; every tag's first and last position come from
``mark_sorted`` (which writes each at the position where the tags pass it), or
without those from binary searches of the sorted tags, done for all tags at once,
and the counts and ids are loads at those positions. One launch where the
reference takes about fifteen operators. ``unique_layout``: one pass over the
sorted positions writes the keys, tags and start of every unique key (at its first
position) and every id's inverse, where the reference takes a scatter each and a
search.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hashrec.table.ops.launch import cdiv, fast_launch, next_pow2

_BLOCK = 1024


@triton.jit
def _first_at_least(tags_ptr, target, valid, n, steps):
    """Per lane: the first position whose tag is >= ``target`` (n when none is)."""
    lo = tl.zeros(target.shape, dtype=tl.int64)
    hi = tl.zeros(target.shape, dtype=tl.int64) + n
    step = 0
    while step < steps:
        open_ = valid & (lo < hi)
        mid = (lo + hi) // 2
        below = tl.load(tags_ptr + mid, mask=open_, other=0) < target
        lo = tl.where(open_ & below, mid + 1, lo)
        hi = tl.where(open_ & ~below, mid, hi)
        step += 1
    return lo


@triton.jit
def _unique_before(group_ptr, first, valid, n, total):
    """Unique keys before position ``first``."""
    return tl.where(first < n, tl.load(group_ptr + tl.minimum(first, n - 1), mask=valid,
                                       other=0), total)


@fast_launch
@triton.jit(do_not_specialize=["n"])
def _summary_kernel(tags_ptr, ids_ptr, group_ptr, bad_ptr, starts_ptr, out_ptr, n, num_tags,
                    steps, HAS_BAD: tl.constexpr, STARTS: tl.constexpr, TAGS: tl.constexpr):
    t = tl.arange(0, TAGS)
    valid = t < num_tags
    if STARTS:
        start = tl.load(starts_ptr + t, mask=valid, other=0)
        end = tl.load(starts_ptr + t + 1, mask=valid, other=0)
    else:
        start = _first_at_least(tags_ptr, t, valid, n, steps)
        end = _first_at_least(tags_ptr, t + 1, valid, n, steps)
    total = tl.load(group_ptr + n - 1) + 1
    count = _unique_before(group_ptr, end, valid, n, total) - \
        _unique_before(group_ptr, start, valid, n, total)
    low = tl.load(ids_ptr + tl.minimum(start, n - 1), mask=valid, other=0)
    if HAS_BAD:
        low = tl.where(tl.load(bad_ptr) != 0, -1, low)
    high = tl.load(ids_ptr + tl.maximum(end - 1, 0), mask=valid, other=0)
    tl.store(out_ptr + t, count, mask=valid)
    tl.store(out_ptr + num_tags + t, low, mask=valid)
    tl.store(out_ptr + 2 * num_tags + t, high, mask=valid)


def tag_summary(sorted_tags: torch.Tensor, sorted_ids: torch.Tensor, group: torch.Tensor,
                num_tags: int, bad: torch.Tensor | None = None,
                starts: torch.Tensor | None = None) -> torch.Tensor:
    """(3, num_tags) int64: unique keys, smallest id, largest id of every tag."""
    n = sorted_tags.numel()
    out = torch.empty(3, num_tags, dtype=torch.int64, device=sorted_tags.device)
    _summary_kernel[(1,)](
        sorted_tags, sorted_ids, group, bad.view(torch.uint8) if bad is not None else group,
        starts if starts is not None else group, out, n, num_tags, n.bit_length() + 1,
        HAS_BAD=bad is not None, STARTS=starts is not None, TAGS=next_pow2(max(num_tags, 2)))
    return out


@fast_launch
@triton.jit(do_not_specialize=["n"])
def _layout_kernel(group_ptr, order_ptr, ids_ptr, tags_ptr, keys_ptr, out_tags_ptr,
                   inverse_ptr, row_start_ptr, n, HAS_TAGS: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    g = tl.load(group_ptr + i, mask=mask, other=0)
    prev = tl.load(group_ptr + i - 1, mask=mask & (i > 0), other=-1)
    first = mask & (g != prev)
    tl.store(keys_ptr + g, tl.load(ids_ptr + i, mask=first, other=0), mask=first)
    if HAS_TAGS:
        tl.store(out_tags_ptr + g, tl.load(tags_ptr + i, mask=first, other=0), mask=first)
    tl.store(row_start_ptr + g, i, mask=first)
    tl.store(row_start_ptr + g + 1, i + 1, mask=mask & (i == n - 1))
    tl.store(inverse_ptr + tl.load(order_ptr + i, mask=mask, other=0), g, mask=mask)


def unique_layout(group: torch.Tensor, order: torch.Tensor, sorted_ids: torch.Tensor,
                  sorted_tags: torch.Tensor | None, u: int
                  ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor, torch.Tensor]:
    """(keys (u,), tags (u,) or None, inverse (n,), row_start (u + 1,))."""
    n, device = group.numel(), group.device
    keys = torch.empty(u, dtype=torch.int64, device=device)
    tags = torch.empty(u, dtype=torch.int32, device=device) if sorted_tags is not None \
        else None
    inverse = torch.empty(n, dtype=torch.int64, device=device)
    row_start = torch.empty(u + 1, dtype=torch.int64, device=device)
    if n == 0:
        row_start.zero_()
        return keys, tags, inverse, row_start
    _layout_kernel[(cdiv(n, _BLOCK),)](
        group, order, sorted_ids, sorted_tags if sorted_tags is not None else group, keys,
        tags if tags is not None else keys, inverse, row_start, n,
        HAS_TAGS=sorted_tags is not None, BLOCK=_BLOCK)
    return keys, tags, inverse, row_start


@fast_launch
@triton.jit
def _keys_kernel(ids_ptr, meta_ptr, keys_ptr, bad_ptr, size, features, pad_key, bits, mask,
                 CLAMP: tl.constexpr, COMPACT: tl.constexpr, ADDRESSES: tl.constexpr,
                 BLOCK: tl.constexpr):
    p = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = p < size
    real = live & (p < tl.load(meta_ptr + features - 1))
    feature = tl.zeros([BLOCK], dtype=tl.int64)
    k = 0
    while k < features - 1:  # the feature of p: the ends at or before p
        feature += (tl.load(meta_ptr + k) <= p).to(tl.int64)
        k += 1
    if ADDRESSES:  # feature f's ids at the address meta[2 F + f], from its start
        start = tl.load(meta_ptr + feature - 1, mask=real & (feature > 0), other=0)
        base = tl.load(meta_ptr + 2 * features + feature, mask=real, other=0)
        x = tl.load(base.to(tl.pointer_type(tl.int64)) + (p - start), mask=real, other=0)
    else:
        x = tl.load(ids_ptr + p, mask=real, other=0)
    if tl.max(((x >> bits) != 0).to(tl.int32), axis=0) > 0:  # every writer writes 1
        tl.store(bad_ptr, 1)
    if CLAMP:
        x = tl.minimum(tl.maximum(x, 0), mask)
    key = tl.where(real, x + tl.load(meta_ptr + features + feature, mask=real, other=0),
                   pad_key)
    if COMPACT:
        key = key.to(tl.int32)
    tl.store(keys_ptr + p, key, mask=live)


def padded_keys(ids: torch.Tensor, meta: torch.Tensor, num_tags: int, bits: int,
                clamp: bool, compact: bool, features: int | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """(one-pass keys (N,) int64, or int32 when ``compact``; 0-d bool: an id too wide).
    ``features``: the ids are read from the addresses in ``meta`` instead of ``ids``."""
    size = ids.numel()
    keys = torch.empty(size, dtype=torch.int32 if compact else torch.int64, device=ids.device)
    bad = torch.zeros((), dtype=torch.bool, device=ids.device)
    if size:
        _keys_kernel[(cdiv(size, _BLOCK),)](
            ids, meta, keys, bad.view(torch.uint8), size, features or meta.numel() // 2,
            num_tags << bits, bits, (1 << bits) - 1, CLAMP=clamp, COMPACT=compact,
            ADDRESSES=features is not None, BLOCK=_BLOCK)
    return keys, bad


@triton.jit
def _write_starts(starts_ptr, at, after, upto, live):
    """Per lane: ``at`` into starts[after + 1 .. upto] (tags clamped to the array)."""
    t = after + 1
    open_ = live & (t <= upto)
    while tl.max(open_.to(tl.int32), axis=0) > 0:
        tl.store(starts_ptr + t, at, mask=open_)
        t += 1
        open_ = open_ & (t <= upto)


@fast_launch
@triton.jit
def _mark_kernel(keys_ptr, ids_ptr, tags_ptr, new_ptr, totals_ptr, starts_ptr, size, bits,
                 mask, num_tags, STARTS: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = i < size
    key = tl.load(keys_ptr + i, mask=live, other=0).to(tl.int64)
    prev = tl.load(keys_ptr + i - 1, mask=live & (i > 0), other=0).to(tl.int64)
    new = (i == 0) | (key != prev)
    tl.store(ids_ptr + i, key & mask, mask=live)
    tl.store(tags_ptr + i, (key >> bits).to(tl.int32), mask=live)
    tl.store(new_ptr + i, new.to(tl.int8), mask=live)
    # this program's unique-key steps (a new key after position 0), for ``_group_kernel``
    tl.store(totals_ptr + tl.program_id(0), tl.sum((live & new & (i > 0)).to(tl.int64), axis=0))
    if STARTS:  # the tags (previous tag, tag] start here; those past the last tag at size
        tag = tl.minimum(tl.maximum(key >> bits, -1), num_tags)
        before = tl.where(i > 0, tl.minimum(tl.maximum(prev >> bits, -1), num_tags), -1)
        _write_starts(starts_ptr, i, before, tag, live & (tag > before))
        _write_starts(starts_ptr, size + tl.zeros_like(i), tag, tl.zeros_like(tag) + num_tags,
                      live & (i == size - 1))


@fast_launch
@triton.jit
def _group_kernel(new_ptr, totals_ptr, group_ptr, size, BLOCK: tl.constexpr,
                  CHUNK: tl.constexpr):
    """Every position's unique key: the steps of the programs of ``_mark_kernel`` before
    this one (summed here, CHUNK at a time) plus this block's own up to the position."""
    pid = tl.program_id(0)
    prefix = tl.zeros([], dtype=tl.int64)
    j = 0
    while j < pid:
        t = j + tl.arange(0, CHUNK)
        prefix += tl.sum(tl.load(totals_ptr + t, mask=t < pid, other=0), axis=0)
        j += CHUNK
    i = pid.to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = i < size
    step = live & (tl.load(new_ptr + i, mask=live, other=0) != 0) & (i > 0)
    tl.store(group_ptr + i, prefix + tl.cumsum(step.to(tl.int64), axis=0), mask=live)


def mark_sorted(keys: torch.Tensor, bits: int, num_tags: int | None = None
                ) -> tuple[torch.Tensor, ...]:
    """(sorted_ids int64, sorted_tags int32, new bool, group int64) of sorted keys (N,),
    and with ``num_tags`` every tag's first position (num_tags + 1,) int64. The group
    (each position's unique key, numbered from 0) comes from the mark programs' sums of
    new keys and one kernel after them, where torch's cumulative sum of a (N,) int64
    array of steps takes two (and the mark kernel wrote the array)."""
    size, device = keys.numel(), keys.device
    ids = torch.empty(size, dtype=torch.int64, device=device)
    tags = torch.empty(size, dtype=torch.int32, device=device)
    new = torch.empty(size, dtype=torch.bool, device=device)
    group = torch.empty(size, dtype=torch.int64, device=device)
    # Every entry is written when size > 0 (at the position where the tags pass it).
    starts = (torch.empty if size else torch.zeros)((num_tags or 0) + 1, dtype=torch.int64,
                                                    device=device)
    if size:
        programs = cdiv(size, _BLOCK)
        totals = torch.empty(programs, dtype=torch.int64, device=device)
        _mark_kernel[(programs,)](
            keys, ids, tags, new.view(torch.int8), totals, starts, size, bits, (1 << bits) - 1,
            num_tags or 0, STARTS=num_tags is not None, BLOCK=_BLOCK)
        _group_kernel[(programs,)](new.view(torch.int8), totals, group, size, BLOCK=_BLOCK,
                                   CHUNK=1024)
    if num_tags is None:
        return ids, tags, new, group
    return ids, tags, new, group, starts
