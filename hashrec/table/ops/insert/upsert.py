"""Triton upsert: find every key and insert the misses, without a host sync.

``upsert_slots`` is the write path of ``find_or_insert`` / ``insert_or_assign`` on
CUDA. Unlike ``insert_keys`` it takes any batch (keys present or absent, repeated
or not) and needs no deduplication or bucket bookkeeping from the caller. Every
launch has a grid fixed by the batch size n, so nothing is read back on the host:

1. one kernel probes every key (the find probe) and writes its slot and a sort
   key: ``bucket << b' | hash bits`` for a miss (31 bits when the bucket fits in
   29, else 63), the maximum for a hit;
2. one stable sort of the n sort keys groups the misses by bucket (equal keys end
   up in one run of equal sort keys) ahead of the hits: a counting sort over the
   buckets (``group.py``) with the same result as a full sort;
3. one kernel gathers the sorted misses (key, tag, score, bucket, digest) and names
   each repeat's first occurrence (``upsert_gather.py``);
4. by default one program per ``UPSERT_BLOCK["block"]`` sorted positions (32, or
   the environment's ``HASHREC_UPSERT_BLOCK``) places its short runs of misses
   together and its long ones run by run (``upsert_block.py``); with the block 0,
   one program per ``UPSERT_CONFIG["runs"]`` sorted positions, where a position
   that starts a bucket's run of misses applies the pinned insert rule
   (``insert/triton.py``) to the run's first occurrences (the others, hits
   included, have nothing to do); in calls of at least
   ``UPSERT_BLOCK["lanes_min"]`` keys (131,072) a lane form (``upsert_lanes.py``,
   one lane per sorted position; ``HASHREC_UPSERT_LANES=0`` turns it off) first
   places the short runs that fit in their buckets' free slots (and writes their
   slots and flags in batch order), and the block form takes the blocks it flags, or,
   where the previous call on the storage flagged few (``_lanes_inline``), the lane
   form places the flagged runs itself and no block form follows; a
   call that expects few misses (``few_misses``, a warm
   table's training lookup) skips the lane form and runs a few block programs a
   multiprocessor over the blocks up to the misses' count the counting sort left on
   the device;
5. one kernel writes every other key's final slot and flags back in batch order (and
   the digests of the entries the lane form placed), and counts the refused keys.

With the counting sort and the block form (the defaults) the sorted positions past the
misses' count are neither written nor read: the probe kernel clears the flags and
counts each miss in its bucket (the counting sort's first step), the counting sort
places the misses alone and gathers their fields as it ranks them (steps 2 and 3 in
one kernel, ``upsert_gather.rank_gather_kernel``), the lane, block and finalize kernels
stop at the count, and the present keys are checked for eviction in batch order (only
where the call evicted, and only in the buckets it evicted from, which the insert
kernels mark in the counting sort's bucket counts). On an H200 that took
insert_or_assign of 1M keys into 64M slots 2% faster at load factor 0.5 (0.339-0.340
against 0.346-0.347 ms at dim 8, 0.430-0.431 against 0.437-0.440 at 64) and 1% at 0.75
and 1.0 than with a count kernel and a gather kernel of their own, the lanes leaving the
batch-order writes to the finalize kernel
(``benchmarks/results/upsert_rank_gather.md``). The marks and the lane form placing
every run itself took it from 0.428 to 0.403 ms at dim 64, load factor 0.5, and from
0.458 to 0.416 at 0.75 (``benchmarks/results/upsert_inline.md``).

The insert is independent of thread timing: a bucket is written by one program (or,
in the lane form, by its run's lanes into the empty slots their ranks name), and all
orders are fixed by the data. Evicted entries come back as (n,) arrays
over the sorted batch with a mask.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import torch
import triton
import triton.language as tl

from hashrec.table._triton_hash import (
    bucket_of_fast,
    check_keys,
    load_tags,
    tagged_hash,
)
from hashrec.table.ops.find.probe import probe_bucket
from hashrec.table.ops.find.triton import digest_line, mask_probe, probe_block, probe_launch
from hashrec.table.ops.insert.group import bucket_counts
from hashrec.table.ops.insert.rows import write_rows
from hashrec.table.ops.insert.runs import insert_run
from hashrec.table.ops.insert.upsert_block import (
    UPSERT_BLOCK,
    block_positions,
    lane_width,
    upsert_block_kernel,
)
from hashrec.table.ops.insert.upsert_gather import sort_misses
from hashrec.table.ops.insert.upsert_lanes import LANE_DONE, LANE_PLACED, upsert_lanes_kernel
from hashrec.table.ops.launch import aligned_rows, cdiv, env_int, fast_launch, maxnreg, next_pow2
from hashrec.table.storage import TableStorage

__all__ = ["UpsertResult", "upsert_slots", "write_rows"]

_WIDE_SENTINEL = 0x7FFFFFFFFFFFFFFF
_NARROW_SENTINEL = 0x7FFFFFFF
# The insert programs' launch: sorted positions per program (a power of two; most
# positions have nothing to do), warps, and incoming keys of a run held in registers
# (longer runs go chunk by chunk). Benchmarks sweep it.
UPSERT_CONFIG = {"runs": 1, "num_warps": 1, "bi": 16}
# Bucket bits up to which sort keys are 32-bit (a faster sort); beyond, 64-bit. The sort
# takes as long whatever bits the keys span within their type: on an H200, a stable sort
# of 1M int32 keys took 0.089 ms at 8 bits and 0.108 at 31, int16 keys 0.061, int64 0.208
# (benchmarks/results/sort_bits_gpu.md), so keys fewer bits wide gain nothing unless a
# narrower type holds them.
NARROW_MAX_SHIFT = 29


def _group_from_env() -> int:
    group = env_int("HASHREC_UPSERT_GROUP", 1)
    if group not in (0, 1):
        raise ValueError(f"HASHREC_UPSERT_GROUP must be 0 (a full sort) or 1 (grouped by "
                         f"bucket), got {group}")
    return group


# 1: step 2 groups the misses by bucket with a counting sort (``group.group_by_bucket``),
# whose work follows the misses, where a full sort's follows the batch; the outcome is
# the same. 0 (HASHREC_UPSERT_GROUP=0): torch's stable sort of all n sort keys.
UPSERT_GROUP = {"count": _group_from_env()}
# Persistent block programs a multiprocessor for calls that expect few misses.
PERSISTENT_PER_SM = 4


@functools.cache
def _multiprocessors(device: torch.device) -> int:
    """Multiprocessors of a CUDA device (a fixed 4 elsewhere: the interpreter's grid)."""
    if device.type != "cuda":
        return 4
    return torch.cuda.get_device_properties(device).multi_processor_count


class UpsertResult(NamedTuple):
    """Outcome of ``upsert_slots`` for a batch of n keys.

    Attributes:
        slots: (n,) int64 slot of every key after the call, -1 when refused (or,
            for a key that was present, when a miss of the same call evicted it).
        inserted: (n,) bool, True at the first occurrence of each key placed by this
            call (its row needs initializing); repeats and present keys are False.
        evicted: (n,) bool mask over the ``evicted_*`` arrays (positions in the
            call's sorted order, not the batch order).
        evicted_keys: (n,) int64, evicted_tags (n,) int32, evicted_scores (n,) int64.
        created: (n,) bool, True at every occurrence of a key placed by this call.
        refused: (1,) int64 on the device, the occurrences of absent keys this call
            did not place (a full bucket kept its entries).
    """

    slots: torch.Tensor
    inserted: torch.Tensor
    evicted: torch.Tensor
    evicted_keys: torch.Tensor
    evicted_tags: torch.Tensor
    evicted_scores: torch.Tensor
    created: torch.Tensor
    refused: torch.Tensor


# The bucket bits are a runtime argument: a growing table changes them at every
# doubling, and a compile-time constant would compile the kernel anew each time.
@fast_launch
@triton.jit(do_not_specialize=["n", "shift"])
def _probe_sort_kernel(keys_ptr, tags_ptr, active_ptr, given_ptr, t_keys, t_tags, t_digests,
                       slots_ptr, sort_ptr, flags_ptr, counts_ptr, tickets_ptr, n, num_buckets,
                       shift, flag_stride,
                       HAS_TAGS: tl.constexpr, HAS_ACTIVE: tl.constexpr, GIVEN: tl.constexpr,
                       MISSES_ONLY: tl.constexpr, CAP: tl.constexpr,
                       LINE: tl.constexpr, WORDS: tl.constexpr, POW2: tl.constexpr,
                       ROUND: tl.constexpr, WIDE: tl.constexpr, BY_WORD: tl.constexpr,
                       MASKS: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    live = mask
    if HAS_ACTIVE:  # inactive keys read as hits without a slot: never probed nor inserted
        live = mask & (tl.load(active_ptr + offs, mask=mask, other=0) != 0)
    key = tl.load(keys_ptr + offs, mask=mask, other=0)
    tag = load_tags(tags_ptr, offs, mask, HAS_TAGS)
    slot = tl.full([BLOCK], -1, dtype=tl.int64)
    # A block without a key to probe (every key of a training lookup's all-hit batch is
    # inactive here) skips the probe (not yet timed).
    if tl.max(live.to(tl.int32), axis=0) > 0:
        slot = probe_bucket(key, tag, live, t_keys, t_tags, t_digests, num_buckets, CAP,
                            LINE, WORDS, POW2, ROUND, BY_WORD, MASKS)
        slot = tl.where(live, slot, -1)
    if GIVEN:  # inactive keys keep the slots the caller gives them
        slot = tl.where(live, slot, tl.load(given_ptr + offs, mask=mask & ~live, other=-1))
    tl.store(slots_ptr + offs, slot, mask=mask)
    h = tagged_hash(key, tag)
    bucket = bucket_of_fast(h, num_buckets, POW2).to(tl.uint64)
    skip = (slot >= 0) | ~live
    sh = shift.to(tl.uint64)
    if WIDE:  # < 2**63 - 1: bucket in bits 63-shift.., hash bits below
        s = ((bucket << (63 - sh)) | (h >> (sh + 2))).to(tl.int64, bitcast=True)
        s = tl.where(skip, 0x7FFFFFFFFFFFFFFF, s)
    else:  # < 2**30
        s = ((bucket << (30 - sh)) | (h >> (34 + sh))).to(tl.int32)
        s = tl.where(skip, 0x7FFFFFFF, s)
    tl.store(sort_ptr + offs, s, mask=mask)
    if MISSES_ONLY:  # the flags start clear (the finalize kernel then writes the misses' alone)
        # Each miss takes a ticket in its bucket's count: the counting sort's first step.
        miss = ~skip
        if tl.max(miss.to(tl.int32), axis=0) > 0:
            ticket = tl.atomic_add(counts_ptr + bucket.to(tl.int64),
                                   tl.full([BLOCK], 1, tl.int32), mask=miss)
            tl.store(tickets_ptr + offs, ticket, mask=miss)
        zero = tl.zeros([BLOCK], dtype=tl.int8)
        tl.store(flags_ptr + offs, zero, mask=mask)
        tl.store(flags_ptr + flag_stride + offs, zero, mask=mask)
        tl.store(flags_ptr + 2 * flag_stride + offs, zero, mask=mask)


@fast_launch
@triton.jit(do_not_specialize=["m"])
def _upsert_kernel(in_keys, in_tags, in_scores, in_digests, in_bucket, in_first, in_pos, m,
                   t_keys, t_tags, t_digests, t_scores, out_slots, out_evicted, ev_any,
                   ev_keys, ev_tags, ev_scores, marks, ALLOW_EVICT: tl.constexpr,
                   CAP: tl.constexpr, CAP_P2: tl.constexpr, BI: tl.constexpr,
                   RUNS: tl.constexpr):
    """Program p serves sorted positions [p * RUNS, (p + 1) * RUNS): each position that
    opens a bucket's run of misses inserts that run; the others have nothing to do."""
    lane = tl.arange(0, RUNS)
    at = tl.program_id(0).to(tl.int64) * RUNS + lane
    buckets = tl.load(in_bucket + at, mask=at < m, other=-1)
    prev = tl.load(in_bucket + at - 1, mask=(at > 0) & (at < m), other=-1)
    opens = (buckets >= 0) & (prev != buckets)
    for r in tl.static_range(RUNS):  # hits, sorted last, open nothing
        this = opens & (lane == r)
        if tl.max(this.to(tl.int32), axis=0) > 0:
            insert_run(in_keys, in_tags, in_scores, in_digests, in_bucket, in_first, in_pos,
                        m, t_keys, t_tags, t_digests, t_scores, out_slots, out_evicted,
                        ev_any, ev_keys, ev_tags, ev_scores, marks,
                        tl.sum(tl.where(this, at, 0), axis=0),
                        tl.sum(tl.where(this, buckets, 0), axis=0), ALLOW_EVICT, CAP, CAP_P2,
                        BI)


@triton.jit
def _evicted_since(keys_ptr, tags_ptr, t_keys, t_tags, pos, slot, check, HAS_TAGS: tl.constexpr):
    """Where ``check``: the key at batch position ``pos`` no longer holds ``slot`` (a miss
    of this call evicted it)."""
    key = tl.load(keys_ptr + pos, mask=check, other=0)
    gone = check & (tl.load(t_keys + slot, mask=check, other=0) != key)
    if t_tags is not None:  # None: the table holds tag 0 alone (``TableStorage.probe_tags``)
        tag = load_tags(tags_ptr, pos, check, HAS_TAGS)
        gone = gone | (check & (tl.load(t_tags + slot, mask=check, other=0) != tag))
    return gone


@fast_launch
@triton.jit(do_not_specialize=["n"])
def _finalize_kernel(sorted_ptr, perm_ptr, first_ptr, out_ptr, keys_ptr, tags_ptr, t_keys,
                     t_tags, t_digests, s_digests, state, slots_ptr, inserted_ptr, created_ptr,
                     evicted_ptr, ev_any, refused_ptr, misses_ptr, probe_ptr, marks,
                     hint_ptr, n, HINT: tl.constexpr,
                     HAS_TAGS: tl.constexpr, ALLOW_EVICT: tl.constexpr, LANES: tl.constexpr,
                     SENTINEL: tl.constexpr, MISSES_ONLY: tl.constexpr, CAP: tl.constexpr,
                     BLOCK: tl.constexpr):
    """Final slot and flags of every key, in batch order; clears unused evicted flags.
    With LANES, the keys ``upsert_lanes_kernel`` placed (``LANE_PLACED``) only get their
    digests here (into slots that were empty, which no present key's check reads): the
    lanes wrote the rest, and all of a run of one (``LANE_DONE``). HINT: program 0 also
    copies the lane form's flagged count (``ev_any[1]``) to ``hint_ptr``.
    MISSES_ONLY: the sorted positions below the misses' count (``misses_ptr``) alone,
    the probe kernel having cleared every flag and written every other key's slot;
    where this call evicted, the present keys in the buckets it evicted from (``marks``,
    -1 there) are checked in batch order (``probe_ptr``: the unsorted sort keys, the
    sentinel at them), disjoint from the misses' positions this kernel writes.
    Storing the batch's rows here (insert_or_assign), or reading every key's row with
    initial rows for new keys (find_or_insert), instead of in a kernel after the call,
    was no faster on an H200 at dim 8 (0.457 against 0.456 ms, 0.459 against 0.449) and
    slower at dims 64 and 128 (0.773 against 0.683 ms insert_or_assign at dim 128,
    load factor 0.5: benchmarks/results/table_gpu_rows_fused.md against
    table_gpu_rows_after.md, one run), so the rows stay a kernel of their own."""
    if HINT:  # the lane form's flagged count, to the host's word (``_hint_word``)
        if tl.program_id(0) == 0:
            tl.store(hint_ptr, tl.load(ev_any + 1))
    i = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = i < n
    if MISSES_ONLY:
        if ALLOW_EVICT:
            if tl.load(ev_any) != 0:
                hit = mask & (tl.load(probe_ptr + i, mask=mask, other=0) == SENTINEL)
                slot = tl.load(slots_ptr + i, mask=hit, other=-1)
                hit = hit & (slot >= 0)
                hit = hit & (tl.load(marks + slot // CAP, mask=hit, other=0) < 0)
                gone = _evicted_since(keys_ptr, tags_ptr, t_keys, t_tags, i, slot, hit,
                                      HAS_TAGS)
                tl.store(slots_ptr + i, tl.full([BLOCK], -1, dtype=tl.int64), mask=gone)
        mask = mask & (i < tl.load(misses_ptr))
    if LANES:  # the lanes' placed keys lack their digests alone (runs of one not even those)
        lane = tl.load(state + i, mask=mask, other=0)
        placed = mask & (lane == LANE_PLACED)
        at = tl.load(out_ptr + i, mask=placed, other=0)
        tl.store(t_digests + at, tl.load(s_digests + i, mask=placed, other=1), mask=placed)
        mask = mask & ~placed & (lane != LANE_DONE)
    miss = mask & (tl.load(sorted_ptr + i, mask=mask, other=SENTINEL) != SENTINEL)
    hit = mask & ~miss
    pos = tl.load(perm_ptr + i, mask=mask, other=0)
    first = tl.load(first_ptr + i, mask=miss, other=-1)
    new_slot = tl.load(out_ptr + first, mask=miss, other=-1)
    slot = tl.load(slots_ptr + pos, mask=hit, other=-1)
    if ALLOW_EVICT:  # a present key of this batch may have been evicted by a miss
        kept = hit & (slot >= 0)
        check = kept & (tl.load(ev_any) != 0)  # only if this call evicted anything
        gone = _evicted_since(keys_ptr, tags_ptr, t_keys, t_tags, pos, slot, check, HAS_TAGS)
        slot = tl.where(kept & ~gone, slot, -1)
        is_first = miss & (first == i)
        ev = tl.load(evicted_ptr + i, mask=is_first, other=0)
        tl.store(evicted_ptr + i, tl.where(is_first, ev, 0), mask=mask)
    else:
        tl.store(evicted_ptr + i, tl.zeros([BLOCK], dtype=tl.int8), mask=mask)
    placed = miss & (new_slot >= 0)
    refused = tl.sum((miss & (new_slot < 0)).to(tl.int64), axis=0)
    if refused > 0:
        tl.atomic_add(refused_ptr, refused)
    tl.store(slots_ptr + pos, tl.where(miss, new_slot, slot), mask=mask)
    tl.store(inserted_ptr + pos, (placed & (first == i)).to(tl.int8), mask=mask)
    tl.store(created_ptr + pos, placed.to(tl.int8), mask=mask)


def _sort_keys(storage: TableStorage, keys: torch.Tensor, tags: torch.Tensor | None,
               active: torch.Tensor | None, given: torch.Tensor | None, slots: torch.Tensor,
               flags: torch.Tensor | None = None,
               counted: tuple[torch.Tensor, torch.Tensor] | None = None
               ) -> tuple[torch.Tensor, int, int]:
    """Probes every active key into ``slots`` (the others get ``given``'s slot, or -1) and
    returns the sort keys, their sentinel and how many low bits of a miss's sort key lie
    below its bucket. ``flags`` (3, n) bool rows (any row stride), when given: cleared on
    the way; and each miss counted in ``counted`` (``group.bucket_counts``, given with the
    flags)."""
    n, nb = keys.numel(), storage.num_buckets
    shift = max(1, (nb - 1).bit_length())
    wide = shift > NARROW_MAX_SHIFT
    sort_key = torch.empty(n, dtype=torch.int64 if wide else torch.int32, device=keys.device)
    probe = probe_launch(storage)
    warps = UPSERT_BLOCK["probe_warps"] or (1 if probe.masks else 2)
    most = UPSERT_BLOCK["probe_keys"]
    block = probe_block(probe.tile, warps, most) if most else probe_block(probe.tile, warps)
    _probe_sort_kernel[(cdiv(n, block),)](
        keys, tags if tags is not None else keys,
        active.view(torch.uint8) if active is not None else keys,
        given if given is not None else keys, storage.keys,
        storage.probe_tags(tags), probe.line, slots, sort_key,
        flags[0].view(torch.int8) if flags is not None else sort_key,
        *(counted if counted is not None else (sort_key, sort_key)), n, nb, shift,
        flags.stride(0) if flags is not None else 0,
        HAS_TAGS=tags is not None, HAS_ACTIVE=active is not None, GIVEN=given is not None,
        MISSES_ONLY=flags is not None, WIDE=wide, BY_WORD=probe.by_word(), BLOCK=block,
        num_warps=warps, **probe.constexprs, **maxnreg(UPSERT_BLOCK["probe_maxnreg"]))
    if wide:
        return sort_key, _WIDE_SENTINEL, 63 - shift
    return sort_key, _NARROW_SENTINEL, 30 - shift


def _lanes_inline(storage: TableStorage, programs: int) -> bool:
    """Whether the lane form places the runs it cannot place in its lanes itself, one by
    one in the program where each opens, so that no block form follows: where the
    previous call of the lane form on this storage left runs to at most 1 /
    ``UPSERT_BLOCK["inline_share"]`` of its blocks (``UPSERT_BLOCK["inline"]`` 1 or 0:
    always or never). Either way the outcome is the same."""
    mode = UPSERT_BLOCK["inline"]
    if mode >= 0:
        return bool(mode)
    flagged = storage.launch_hints.get("upsert_flagged")
    return flagged is not None and int(flagged[0]) * UPSERT_BLOCK["inline_share"] <= programs


def _note_flagged(storage: TableStorage, flagged: torch.Tensor) -> None:
    """Keeps the count of blocks the lane form flagged (``flagged`` (1,) int32 on the
    device) for the next call's ``_lanes_inline``, where no kernel writes it to the host
    (``_hint_word``), without waiting for it: a copy into
    pinned host memory, on a stream of its own so that the caller's next kernels do not
    queue behind it, which the next call reads as it stands (an older count, if the copy
    has not landed, only picks a slower launch)."""
    hints = storage.launch_hints
    if flagged.device.type != "cuda":
        hints["upsert_flagged"] = flagged.clone()
        return
    held = hints.get("upsert_flagged")
    if held is None:
        held = hints["upsert_flagged"] = torch.zeros(1, dtype=torch.int32, pin_memory=True)
    side, ready = _hint_stream(flagged.device)
    ready.record(torch.cuda.current_stream(flagged.device))
    side.wait_event(ready)
    with torch.cuda.stream(side):
        held.copy_(flagged, non_blocking=True)
    flagged.record_stream(side)  # its memory is not reused before the copy ran


def _hint_word(storage: TableStorage) -> torch.Tensor | None:
    """The pinned host word that the finalize kernel itself writes the lane form's
    flagged count into, where kernels reach pinned host memory (the storage tiers'
    ``host_access`` "uva"): no copy and stream switch to issue, which took about 10% off
    the insert ops' host issue on an H200 host, the device's time the same
    (``benchmarks/results/upsert_host.md``). None elsewhere."""
    if storage.device.type != "cuda" or not _kernels_reach_host():
        return None
    hints = storage.launch_hints
    held = hints.get("upsert_flagged")
    if held is None:  # on a CUDA storage, always a pinned word (here or ``_note_flagged``)
        held = hints["upsert_flagged"] = torch.zeros(1, dtype=torch.int32, pin_memory=True)
    return held


@functools.cache
def _kernels_reach_host() -> bool:
    from hashrec.table.tiers.two_part import UVA, host_access  # the tiers import the ops
    return host_access("cuda") == UVA


@functools.cache
def _hint_stream(device: torch.device) -> tuple[torch.cuda.Stream, torch.cuda.Event]:
    """The stream that copies ``_note_flagged``'s counts to the host, and an event."""
    return torch.cuda.Stream(device), torch.cuda.Event()


def _empty(n: int, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    return torch.empty(n, dtype=dtype, device=device)


def _insert_misses(storage: TableStorage, args: tuple, allow_evict: bool,
                   misses: torch.Tensor | None, persistent: bool, slots: torch.Tensor,
                   flags: torch.Tensor) -> torch.Tensor | None:
    """Places the sorted misses (step 4); returns the lanes' outcomes when the lane form
    ran first (the keys it placed then have their slots and inserted and created flags
    in ``slots`` and ``flags``, in batch order, and lack only their digests, which the
    finalize step writes), else None.
    ``misses`` (1,) int32 on the device, when given: the count of sorted misses, the
    positions past it holding nothing (the block form only). ``persistent`` (with
    ``misses``): persistent block programs without the lane form (a call expecting few
    misses)."""
    (s_keys, s_tags, s_scores, s_digests, s_bucket, first, perm, n, t_keys, t_tags,
     t_digests, t_scores, out, evicted, ev_any, *ev, marks) = args
    cap, evict = storage.bucket_capacity, bool(allow_evict)
    config, block = UPSERT_CONFIG, UPSERT_BLOCK
    if not block["block"]:
        _upsert_kernel[(cdiv(n, config["runs"]),)](
            *args, ALLOW_EVICT=evict, CAP=cap, CAP_P2=next_pow2(cap), BI=config["bi"],
            RUNS=config["runs"], num_warps=config["num_warps"])
        return None
    b = block_positions(block["block"], block["elements"], cap)
    programs, state, blocks = cdiv(n, b), None, None
    line, width, words = digest_line(storage)
    if persistent:
        programs = min(programs, PERSISTENT_PER_SM * _multiprocessors(storage.device))
    elif block["lanes"] and words and n >= block["lanes_min"]:
        # The block form then serves only the blocks the lane form flags.
        state = _empty(n, torch.int8, storage.device)
        blocks = _empty(programs, torch.int8, storage.device)
        longest = lane_width(block, cap)
        inline = _lanes_inline(storage, programs)
        upsert_lanes_kernel[(programs,)](
            s_keys, s_tags, s_scores, s_bucket, first, perm, n, line, t_keys, t_tags, t_scores,
            out, evicted, state, blocks, misses if misses is not None else blocks, slots,
            flags[0].view(torch.int8), flags.stride(0), t_digests, s_digests, ev_any, *ev,
            marks, ev_any[1:],
            ALLOW_EVICT=evict, CAP=cap, CAP_P2=next_pow2(cap), LINE=width, W=longest,
            WIN=next_pow2(2 * longest + 1), BI=block["inline_bi"] if inline else 1,
            MISSES_ONLY=misses is not None, MASKS=mask_probe(cap, words), INLINE=inline,
            BLOCK=b, num_warps=block["lane_warps"],
            **maxnreg(block["inline_maxnreg"] if inline else 0))
        if inline:  # the lane form placed every run itself
            return state
    upsert_block_kernel[(programs,)](
        *args, state if state is not None else s_digests,
        blocks if blocks is not None else s_digests,
        misses if misses is not None else s_digests, ALLOW_EVICT=evict, CAP=cap,
        CAP_P2=next_pow2(cap), BI=config["bi"], B=b, W=block["width"],
        LANES=state is not None, PERSISTENT=persistent, MISSES_ONLY=misses is not None,
        num_warps=block["persistent_warps" if persistent else "num_warps"],
        **maxnreg(block["persistent_maxnreg" if persistent else "maxnreg"]))
    return state


def _check_args(storage: TableStorage, keys: torch.Tensor, tags: torch.Tensor | None,
                scores: torch.Tensor, active: torch.Tensor | None,
                given_slots: torch.Tensor | None) -> None:
    """``upsert_slots``' argument checks: ValueError naming the argument."""
    check_keys(keys, tags, storage.device)
    if scores.dtype != torch.int64 or scores.shape != keys.shape:
        raise ValueError(f"scores must be int64 of shape {tuple(keys.shape)}, "
                         f"got {scores.dtype} {tuple(scores.shape)}")
    if active is not None and (active.dtype != torch.bool or active.shape != keys.shape):
        raise ValueError(f"active must be bool of shape {tuple(keys.shape)}, "
                         f"got {active.dtype} {tuple(active.shape)}")
    if given_slots is not None and (active is None or given_slots.dtype != torch.int64
                                    or given_slots.shape != keys.shape):
        raise ValueError("given_slots must be int64 of the keys' shape, and come with active")


def upsert_slots(storage: TableStorage, keys: torch.Tensor, tags: torch.Tensor | None,
                 scores: torch.Tensor, allow_evict: bool,
                 active: torch.Tensor | None = None,
                 given_slots: torch.Tensor | None = None,
                 few_misses: bool = False) -> UpsertResult:
    """Finds keys (n,) int64 [+ tags] and inserts the missing ones with ``scores`` (n,).

    Repeated keys are inserted once, with the score of their first occurrence.
    Only index fields are written; rows flagged ``inserted`` need initializing
    (``write_rows`` / ``read_or_init_rows``). No host sync. Returns ``UpsertResult``.

    ``active`` (n,) bool, when given, limits the call to those keys: an inactive key
    is neither looked up nor inserted and reads as slot -1 with no flags (a fixed-size
    stand-in for passing ``keys[active]``, which would need a host sync).
    ``given_slots`` (n,) int64, with ``active``: the slots the inactive keys read as
    instead of -1 (a caller's own lookup of them; saves it a merge after the call).
    ``few_misses``: the caller expects few of the keys to miss (a warm table's training
    lookup): with the counting sort, the misses are placed by a few persistent block
    programs, without the lane form, whose launches grow with n.
    """
    _check_args(storage, keys, tags, scores, active, given_slots)
    active = active.contiguous() if active is not None else None
    given_slots = given_slots.contiguous() if given_slots is not None else None
    storage.note_tags(tags)
    t_tags = storage.probe_tags(tags)
    keys, scores = keys.contiguous(), scores.contiguous()
    tags = tags.contiguous() if tags is not None else None
    n, device, nb = keys.numel(), storage.device, storage.num_buckets
    slots = _empty(n, torch.int64, device)
    # inserted, created and evicted flags, rows 16-byte aligned (a stride the kernels take)
    flags = aligned_rows(3, n, torch.bool, device)
    # Work arrays in two allocations, one row each (rows start 16-byte aligned).
    ev_keys, ev_scores, s_keys, s_scores, first, out, s_bucket = aligned_rows(
        7, n, torch.int64, device).unbind(0)
    ev_tags, s_tags = aligned_rows(2, n, torch.int32, device).unbind(0)
    ev = (ev_keys, ev_tags, ev_scores)
    if n == 0:
        return UpsertResult(slots, flags[0], flags[2], *ev, flags[1],
                            torch.zeros(1, dtype=torch.int64, device=device))
    refused = _empty(1, torch.int64, device)  # cleared by the gather, added to by the finalize
    # With the counting sort and the block form, the call works on the sorted misses alone
    # after the probe (whose kernel clears the flags): the sorted positions past the
    # misses' count, which the device knows, are neither written nor read.
    misses_only = bool(UPSERT_GROUP["count"]) and bool(UPSERT_BLOCK["block"])
    counted = bucket_counts(nb, n, device) if misses_only else None
    probed, sentinel, low = _sort_keys(storage, keys, tags, active, given_slots, slots,
                                       flags if misses_only else None, counted)
    s_digests = _empty(n, torch.uint8, device)
    tag_arg = tags if tags is not None else keys
    grid = (cdiv(n, 512),)
    # Cleared by the gather: [0] set where a miss evicts, [1] the blocks the lane form
    # leaves to the block form.
    ev_any = _empty(2, torch.int32, device)
    sort_key, perm, misses, marks = sort_misses(
        nb, keys, tags, scores, probed, sentinel, low, counted, bool(UPSERT_GROUP["count"]),
        (s_keys, s_tags, s_scores, s_digests, s_bucket, first, ev_any, refused))
    evicted = flags[2].view(torch.int8)
    state = _insert_misses(storage, (s_keys, s_tags, s_scores, s_digests, s_bucket, first,
                                     perm, n, storage.keys, t_tags, storage.digests,
                                     storage.scores, out, evicted, ev_any, *ev, marks),
                           allow_evict,
                           misses, misses_only and few_misses, slots, flags)
    hint = _hint_word(storage) if state is not None else None
    _finalize_kernel[grid](
        sort_key, perm, first, out, keys, tag_arg, storage.keys, t_tags, storage.digests,
        s_digests, state if state is not None else s_digests, slots,
        flags[0].view(torch.int8), flags[1].view(torch.int8), evicted, ev_any, refused,
        misses if misses_only else refused, probed, marks if misses_only else refused,
        hint if hint is not None else refused, n, HINT=hint is not None,
        HAS_TAGS=tags is not None, ALLOW_EVICT=bool(allow_evict), LANES=state is not None,
        SENTINEL=sentinel, MISSES_ONLY=misses_only, CAP=storage.bucket_capacity, BLOCK=512)
    if state is not None and hint is None:
        _note_flagged(storage, ev_any[1:])
    return UpsertResult(slots, flags[0], flags[2], *ev, flags[1], refused)
