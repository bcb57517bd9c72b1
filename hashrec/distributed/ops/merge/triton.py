"""Triton ``first_in_runs`` with the reference's signature (see ``reference.py``).

Each key looks for its (tag, key) in every earlier run by binary search (the runs
are sorted and free of repeats) and takes the position of the first run that holds
it. One launch and no sort, where the reference sorts twice and scans.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from hashrec.distributed.ops.merge import reference
from hashrec.table.ops.launch import cdiv, fast_launch

_BLOCK = 512


@fast_launch
@triton.jit(do_not_specialize=["m"])
def _first_kernel(keys_ptr, tags_ptr, starts_ptr, rep_ptr, active_ptr, m, runs, steps,
                  HAS_TAGS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < m
    key = tl.load(keys_ptr + offs, mask=mask, other=0)
    if HAS_TAGS:
        tag = tl.load(tags_ptr + offs, mask=mask, other=0)
    rep = offs
    run = 0
    while run < runs:
        lo = tl.zeros((BLOCK,), dtype=tl.int64) + tl.load(starts_ptr + run)
        end = tl.load(starts_ptr + run + 1)
        # Only runs before a key's own can hold its first occurrence.
        live = mask & (rep == offs) & (end <= offs)
        hi = tl.zeros((BLOCK,), dtype=tl.int64) + end
        step = 0
        while step < steps:
            open_ = live & (lo < hi)
            mid = (lo + hi) // 2
            other = tl.load(keys_ptr + mid, mask=open_, other=0)
            below = other < key
            if HAS_TAGS:
                other_tag = tl.load(tags_ptr + mid, mask=open_, other=0)
                below = (other_tag < tag) | ((other_tag == tag) & below)
            lo = tl.where(open_ & below, mid + 1, lo)
            hi = tl.where(open_ & ~below, mid, hi)
            step += 1
        hit = live & (lo < end)
        found = tl.load(keys_ptr + lo, mask=hit, other=0) == key
        if HAS_TAGS:
            found = found & (tl.load(tags_ptr + lo, mask=hit, other=0) == tag)
        rep = tl.where(hit & found, lo, rep)
        run += 1
    tl.store(rep_ptr + offs, rep, mask=mask)
    tl.store(active_ptr + offs, rep == offs, mask=mask)


def first_in_runs(keys: torch.Tensor, tags: torch.Tensor | None, runs: list[int],
                  bounds: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """See ``reference.first_in_runs`` (here the runs must be sorted, and a key repeated
    within its run is not linked to its earlier copy: free of repeats, or repeats that
    the caller leaves inactive, such as padding)."""
    m = keys.numel()
    if m == 0 or sum(runs) != m:
        return reference.first_in_runs(keys, tags, runs)
    if bounds is None:
        starts = [0]
        for length in runs:
            starts.append(starts[-1] + length)
        bounds = torch.tensor(starts, dtype=torch.int64, pin_memory=keys.is_cuda).to(
            keys.device, non_blocking=True)
    rep = torch.empty(m, dtype=torch.int64, device=keys.device)
    active = torch.empty(m, dtype=torch.bool, device=keys.device)
    steps = max(runs).bit_length()
    _first_kernel[(cdiv(m, _BLOCK),)](keys.contiguous(), keys if tags is None else
                                      tags.contiguous(), bounds, rep, active, m, len(runs),
                                      steps, HAS_TAGS=tags is not None, BLOCK=_BLOCK)
    return rep, active
