"""Kernels of the fixed-size training lookup (``hashrec.table.fixed_lookup``).

Each replaces a chain of small PyTorch ops (a dozen launches or more) with one
launch over the batch's u unique keys; none reads anything back on the host:

* ``protect_hits``: the score every hit gets after the call (LFU: stored score
  plus the batch count; STEP / TIMESTAMP: the clock; CUSTOMIZED: the caller's),
  and the hits' stored scores set to the maximum so that no insert of the call
  evicts them (or, when the call inserts nothing, to their new scores at once);
* ``found_masks`` and ``add_mask_counts`` (the captured lookup's): a find split
  into the masks of the keys that take part, and the counters added in place;
* ``count_admission``: the admission counter's find, count, admit-and-erase and
  count update, returning which keys were admitted, their totals and which
  need a new counter.

The rows of the lookup (``finish_rows``, ``expand_rows``) are in ``finish.py``.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from hashrec.table._triton_hash import load_tags
from hashrec.table.ops.find.probe import probe_bucket
from hashrec.table.ops.find.triton import probe_block, probe_launch
from hashrec.table.ops.launch import aligned_rows, cdiv, fast_launch
from hashrec.table.storage import TableStorage

# Hit-score modes of protect_hits.
SCORE_GIVEN, SCORE_LFU, SCORE_CLOCK = 0, 1, 2
_SCORE_DEVICE_CLOCK = 3
_BLOCK = 256
_COUNT_BLOCK = 4096  # keys a program of the mask kernels


@fast_launch
@triton.jit(do_not_specialize=["n"])
def _protect_kernel(slots_ptr, counts_ptr, given_ptr, t_scores, out_ptr, guard_ptr, clock_ptr,
                    n, clock, MODE: tl.constexpr, GUARDED: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    slot = tl.load(slots_ptr + i, mask=mask, other=-1)
    hit = mask & (slot >= 0)
    new = tl.zeros([BLOCK], dtype=tl.int64) + 0x7FFFFFFFFFFFFFFF
    if MODE == 0:
        score = tl.load(given_ptr + i, mask=mask, other=0)
    elif MODE == 1:
        score = tl.load(t_scores + slot, mask=hit, other=0) + tl.load(counts_ptr + i, mask=mask,
                                                                      other=0)
    else:
        if MODE == 3:  # the clock on the device (a captured lookup's)
            clock = tl.load(clock_ptr)
        score = tl.zeros([BLOCK], dtype=tl.int64) + clock
    if GUARDED:  # no insert to protect from: the hits take their new scores at once
        inserts = tl.load(guard_ptr) != 0
        new = tl.where(inserts, new, score)
        tl.store(out_ptr + i, score, mask=mask & inserts)  # read by finish_rows only then
    else:
        tl.store(out_ptr + i, score, mask=mask)
    tl.store(t_scores + slot, new, mask=hit)


def protect_hits(storage: TableStorage, slots: torch.Tensor, counts: torch.Tensor,
                 given: torch.Tensor | None, mode: int, clock: int | torch.Tensor = 0,
                 guard: torch.Tensor | None = None) -> torch.Tensor:
    """Scores (u,) int64 the keys at ``slots`` (-1: miss) get after the call, by ``mode``
    (SCORE_GIVEN: ``given``; SCORE_LFU: stored score + ``counts``; SCORE_CLOCK:
    ``clock``, an int or a 1-element int64 tensor on the device, read when the kernel
    runs); the hits' stored scores become the int64 maximum, or with ``guard`` (a
    0-d bool on the device: whether the call inserts anything) False as the kernel
    runs, these scores at once (``finish_rows`` with the same guard then leaves them, and
    reads none of the returned scores, which are then left unwritten). One launch."""
    n = slots.numel()
    out = torch.empty(n, dtype=torch.int64, device=slots.device)
    on_device = isinstance(clock, torch.Tensor)
    if on_device and mode == SCORE_CLOCK:
        mode = _SCORE_DEVICE_CLOCK
    if n:
        _protect_kernel[(cdiv(n, _BLOCK),)](
            slots, counts, given if given is not None else counts, storage.scores, out,
            guard.view(torch.int8) if guard is not None else slots,
            clock if on_device else slots, n, 0 if on_device else int(clock), MODE=mode,
            GUARDED=guard is not None, BLOCK=_BLOCK)
    return out


@fast_launch
@triton.jit(do_not_specialize=["n"])
def _count_kernel(keys_ptr, tags_ptr, counts_ptr, active_ptr, t_keys, t_tags, t_line,
                  t_digests, t_scores, admitted_ptr, totals_ptr, insert_ptr, n, num_buckets,
                  threshold, HAS_TAGS: tl.constexpr, CAP: tl.constexpr, LINE: tl.constexpr,
                  WORDS: tl.constexpr, POW2: tl.constexpr, ROUND: tl.constexpr,
                  BY_WORD: tl.constexpr, MASKS: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    active = mask & (tl.load(active_ptr + i, mask=mask, other=0) != 0)
    key = tl.load(keys_ptr + i, mask=active, other=0)
    tag = load_tags(tags_ptr, i, active, HAS_TAGS)
    slot = probe_bucket(key, tag, active, t_keys, t_tags, t_line, num_buckets, CAP, LINE, WORDS,
                        POW2, ROUND, BY_WORD, MASKS)
    hit = active & (slot >= 0)
    total = tl.load(counts_ptr + i, mask=mask, other=0) + tl.load(t_scores + slot, mask=hit,
                                                                  other=0)
    admitted = active & (total >= threshold)
    # A key is stored at most once and keys are unique, so no two programs touch one slot.
    tl.store(t_digests + slot, tl.zeros([BLOCK], dtype=tl.uint8), mask=hit & admitted)
    tl.store(t_scores + slot, total, mask=hit & ~admitted)
    tl.store(admitted_ptr + i, admitted.to(tl.int8), mask=mask)
    tl.store(totals_ptr + i, total, mask=mask)
    tl.store(insert_ptr + i, (active & ~hit & ~admitted).to(tl.int8), mask=mask)


class Counted(NamedTuple):
    """``count_admission`` of a batch: admitted (u,) bool, totals (u,) int64 (the counts
    after this batch), new (u,) bool: active keys without a counter, not admitted."""

    admitted: torch.Tensor
    totals: torch.Tensor
    new: torch.Tensor


def count_admission(storage: TableStorage, keys: torch.Tensor, tags: torch.Tensor | None,
                    counts: torch.Tensor, active: torch.Tensor, threshold: int) -> Counted:
    """Adds ``counts`` to the counters (``storage``: the counter table) of the ``active``
    unique keys: a key whose total reaches ``threshold`` is admitted and its counter
    erased; an existing counter below it takes the total. One launch; the new
    counters are the caller's to insert."""
    n = keys.numel()
    flags = aligned_rows(2, n, torch.bool, keys.device)
    totals = torch.empty(n, dtype=torch.int64, device=keys.device)
    if n:
        probe = probe_launch(storage)
        block = probe_block(probe.tile)
        _count_kernel[(cdiv(n, block),)](
            keys, tags if tags is not None else keys, counts, active.view(torch.int8),
            storage.keys, storage.tags, probe.line, storage.digests, storage.scores,
            flags[0].view(torch.int8), totals, flags[1].view(torch.int8), n,
            storage.num_buckets, int(threshold), HAS_TAGS=tags is not None,
            BY_WORD=probe.by_word(), BLOCK=block, num_warps=2, **probe.constexprs)
    return Counted(flags[0], totals, flags[1])


# n stays specialized: the captured lookup calls this at its padded size, one variant;
# unspecialized the kernel took 255 registers and spilled (compiled for sm_90:
# benchmarks/results/specialization_cost.md).
@fast_launch
@triton.jit
def _found_kernel(slots_ptr, active_ptr, count_ptr, hit_ptr, pending_ptr, live_ptr, any_ptr, n,
                  HAS_ACTIVE: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    live = mask & (i < tl.load(count_ptr))
    if HAS_ACTIVE:
        live = live & (tl.load(active_ptr + i, mask=mask, other=0) != 0)
    slot = tl.where(live, tl.load(slots_ptr + i, mask=mask, other=-1), -1)
    hit = live & (slot >= 0)
    pending = live & (slot < 0)
    tl.store(slots_ptr + i, slot, mask=mask)
    tl.store(hit_ptr + i, hit.to(tl.int8), mask=mask)
    tl.store(pending_ptr + i, pending.to(tl.int8), mask=mask)
    tl.store(live_ptr + i, live.to(tl.int8), mask=mask)
    if tl.max(pending.to(tl.int32), axis=0) > 0:  # every writer writes 1
        tl.store(any_ptr, 1)


def found_masks(slots: torch.Tensor, active: torch.Tensor | None, count: torch.Tensor
                ) -> tuple[torch.Tensor, ...]:
    """Splits a find's ``slots`` (u,) int64 over the keys that take part: the first
    ``count`` ((1,) int64 on the device, read when the kernel runs), those of them in
    ``active`` (u,) bool when given. Returns (slots, -1 where not taking part (the
    given tensor, written in place), hit, pending (taking part and not found), live
    (taking part), each (u,) bool, and a 0-d bool: whether any key is pending). One
    launch, where the masks in torch took six."""
    n = slots.numel()
    flags = aligned_rows(3, n, torch.bool, slots.device)
    any_pending = torch.zeros((), dtype=torch.bool, device=slots.device)
    if n:
        _found_kernel[(cdiv(n, _COUNT_BLOCK),)](
            slots, active.view(torch.int8) if active is not None else slots, count,
            *flags.view(torch.int8).unbind(0), any_pending.view(torch.int8), n,
            HAS_ACTIVE=active is not None, BLOCK=_COUNT_BLOCK)
    return (slots, *flags.unbind(0), any_pending)


@triton.jit
def _add_sum(mask_ptr, totals_ptr, j, i, live):
    """Adds the True count of ``mask_ptr``'s (int8) entries ``i`` to ``totals_ptr[j]``."""
    count = tl.sum(tl.load(mask_ptr + i, mask=live, other=0).to(tl.int64), axis=0)
    tl.atomic_add(totals_ptr + j, count, sem="relaxed")


# n stays specialized: the captured lookup calls this at its padded size, one variant.
@fast_launch
@triton.jit
def _totals_kernel(m0, m1, m2, m3, m4, m5, extra_ptr, totals_ptr, n, K: tl.constexpr,
                   EXTRA: tl.constexpr, BLOCK: tl.constexpr):
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    live = i < n
    _add_sum(m0, totals_ptr, 0, i, live)
    if K > 1:
        _add_sum(m1, totals_ptr, 1, i, live)
    if K > 2:
        _add_sum(m2, totals_ptr, 2, i, live)
    if K > 3:
        _add_sum(m3, totals_ptr, 3, i, live)
    if K > 4:
        _add_sum(m4, totals_ptr, 4, i, live)
    if K > 5:
        _add_sum(m5, totals_ptr, 5, i, live)
    if EXTRA:
        if tl.program_id(0) == 0:
            tl.atomic_add(totals_ptr + K, tl.load(extra_ptr), sem="relaxed")


MAX_MASKS = 6  # masks add_mask_counts takes


def add_mask_counts(totals: torch.Tensor, masks: list[torch.Tensor],
                    extra: torch.Tensor | None = None) -> None:
    """Adds each (n,) bool mask's True count to ``totals`` (int64, one entry a mask, then
    one for ``extra``, a 0-d int64 count added as it is), in place: one launch where
    stacking the masks and summing them took four. The sums are of integers, so the
    atomic adds give the same totals in any order."""
    if not 1 <= len(masks) <= MAX_MASKS:
        raise ValueError(f"add_mask_counts takes 1 to {MAX_MASKS} masks, got {len(masks)}")
    n = masks[0].numel()
    want = len(masks) + (extra is not None)
    if totals.dtype != torch.int64 or totals.numel() != want:
        raise ValueError(f"totals must be int64 with {want} entries, got {totals.dtype} "
                         f"{tuple(totals.shape)}")
    views = [m.view(torch.int8) for m in masks]
    views += [views[0]] * (MAX_MASKS - len(views))
    _totals_kernel[(max(1, cdiv(n, _COUNT_BLOCK)),)](
        *views, extra.to(torch.int64) if extra is not None else totals, totals, n,
        K=len(masks), EXTRA=extra is not None, BLOCK=_COUNT_BLOCK)


__all__ = ["SCORE_CLOCK", "SCORE_GIVEN", "SCORE_LFU", "Counted", "add_mask_counts",
           "count_admission", "found_masks", "protect_hits"]
