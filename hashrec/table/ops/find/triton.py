"""Triton find: digest probe, then key + tag compare, inside the key's bucket only.

One program handles ``BLOCK`` keys. Each key's bucket digest line (128 bytes at
the default bucket capacity) is read as 32-bit words and compared four digests
at a time with an exact byte-match test (SWAR, no false positives), so the whole
line costs a few integer operations per word. In buckets of up to 128 slots (the
default, ``MASK_PROBE``) the thread that holds a key reads its line in 16-byte chunks
and packs the matches into two 64-bit masks (``line_masks``); the two lowest bits are
confirmed together (one round of memory latency for almost every key), and only keys
with a third match (about 1.5% at a full bucket) go through a loop. Wider buckets that
are a multiple of 128 slots (the admission counters' 1,024) are probed the same way one
128-slot segment after the other, until the key is found (``_probe_segments``); other
wide buckets take the matches from a (keys, line) tile, the two lowest found by
reductions over its words (``WORD_PROBE``). With a power-of-two bucket count (the usual
case: tables grow by doubling) the bucket is a bit mask of the hash, not a 64-bit
modulo. Bucket capacities that are not a multiple of 4 fall back to comparing bytes.
``find_values`` also gathers the embedding columns of found rows in the same program,
so a lookup is a single launch.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from hashrec.table._triton_hash import (
    bucket_of_fast,
    check_keys,
    digest_of,
    is_pow2,
    load_tags,
    tagged_hash,
)
from hashrec.table.ops.launch import cdiv, env_int, fast_launch, maxnreg, next_pow2
from hashrec.table.storage import TableStorage


@triton.jit
def match_bytes(words, dig):
    """0x80 at each byte of ``words`` (uint32) equal to ``dig`` (per row), else 0; exact."""
    x = words ^ (dig.to(tl.uint32) * 0x01010101)[:, None]
    low7 = (x & 0x7F7F7F7F) + 0x7F7F7F7F  # high bit set iff the low 7 bits are nonzero
    return ((low7 | x) & 0x80808080) ^ 0x80808080


@triton.jit
def _lowest_byte(word):
    """Byte (0-3) of the lowest flag (0x80) of each nonzero word."""
    low = word & (word ^ (word - 1))
    return ((low >> 15) != 0).to(tl.int32) + ((low >> 23) != 0).to(tl.int32) + (
        (low >> 31) != 0).to(tl.int32)


@triton.jit
def _byte_at(word, w):
    """Slot column of the lowest flag of ``word`` (word ``w`` of the line)."""
    return w * 4 + _lowest_byte(word)


@triton.jit
def _first_candidate(cand, col, WORDS: tl.constexpr, NONE: tl.constexpr):
    """Lowest candidate slot column per row: (BLOCK,) int32, NONE when there is none."""
    if WORDS:
        pos = tl.where(cand != 0, _byte_at(cand, col[None, :]), NONE)
    else:
        pos = tl.where(cand, col[None, :], NONE)
    return tl.min(pos, axis=1)


@triton.jit
def _drop_through(cand, col, last, WORDS: tl.constexpr):
    """``cand`` without the candidates at slot columns <= ``last`` (per row)."""
    if WORDS:
        k = last[:, None] - col[None, :] * 4 + 1  # bytes of the word to drop, from the bottom
        shift = (tl.minimum(tl.maximum(k, 0), 3) * 8).to(tl.uint32)
        return tl.where(k >= 4, 0, (cand >> shift) << shift)
    return cand & (col[None, :] > last[:, None])


@triton.jit
def _candidates(t_digests, bucket, dig, mask, CAP: tl.constexpr, LINE: tl.constexpr,
                WORDS: tl.constexpr):
    """Digest matches of each key's bucket: a (BLOCK, LINE) tile and its column index."""
    col = tl.arange(0, LINE)
    if WORDS:  # t_digests is the digest array viewed as int32 words
        in_bucket = mask[:, None] & (col[None, :] < CAP // 4)
        ptr = t_digests + bucket[:, None] * (CAP // 4) + col[None, :]
        words = tl.load(ptr, mask=in_bucket, other=0).to(tl.uint32, bitcast=True)
        cand = tl.where(in_bucket, match_bytes(words, dig), 0)
    else:
        in_bucket = mask[:, None] & (col[None, :] < CAP)
        stored = tl.load(t_digests + bucket[:, None] * CAP + col[None, :], mask=in_bucket,
                         other=0)
        cand = in_bucket & (stored.to(tl.int32) == dig[:, None])
    return cand, col


@triton.jit
def _confirm(t_keys, t_tags, slot, live, key, tag):
    """Whether the entry at ``slot`` is (key, tag), where ``live``. ``t_tags`` None: the
    table holds tag 0 alone (``TableStorage.tagged`` False), and the key decides."""
    same = live & (tl.load(t_keys + slot, mask=live, other=0) == key)
    if t_tags is not None:
        same = same & (tl.load(t_tags + slot, mask=live, other=0) == tag)
    return same


@triton.jit
def _word_at(cand, col, w):
    """Word ``w`` of each row of ``cand`` (0 for a column past the line): a sum over one
    nonzero term, which no signedness of the words can change."""
    return tl.sum(tl.where(col[None, :] == w[:, None], cand, 0), axis=1)


@triton.jit
def _third(cand, col, w1, r1, w2, c2, from_c2, CAP: tl.constexpr, LINE: tl.constexpr):
    """The third lowest candidate column of each row (CAP when none), from ``_lowest``'s
    first two words: within the first word, else the second, else the next nonzero one."""
    r1b = r1 & (r1 - 1)
    r2 = c2 & (c2 - 1)
    w3 = tl.min(tl.where((cand != 0) & (col[None, :] > w2[:, None]), col[None, :], LINE),
                axis=1)
    c3 = _word_at(cand, col, w3)
    after_c2 = tl.where(r2 != 0, _byte_at(r2, w2), tl.where(c3 != 0, _byte_at(c3, w3), CAP))
    return tl.where(r1b != 0, _byte_at(r1b, w1), tl.where(r1 != 0, from_c2, after_c2))


@triton.jit
def _lowest(cand, col, CAP: tl.constexpr, LINE: tl.constexpr, THREE: tl.constexpr):
    """The lowest candidate columns of each row (CAP when none) and whether it has more,
    from reductions over the digest words alone (the lowest nonzero words and the flag
    count; byte positions are found once per row, not per word): (first, second, last,
    more). ``last`` is the third with THREE, else the second."""
    nz = cand != 0
    w1 = tl.min(tl.where(nz, col[None, :], LINE), axis=1)
    c1 = _word_at(cand, col, w1)
    r1 = c1 & (c1 - 1)  # the word without its lowest flag
    w2 = tl.min(tl.where(nz & (col[None, :] > w1[:, None]), col[None, :], LINE), axis=1)
    c2 = _word_at(cand, col, w2)
    flags = tl.sum((((cand >> 7) * 0x01010101) >> 24).to(tl.int32), axis=1)
    first = tl.where(c1 != 0, _byte_at(c1, w1), CAP)
    from_c2 = tl.where(c2 != 0, _byte_at(c2, w2), CAP)
    second = tl.where(r1 != 0, _byte_at(r1, w1), from_c2)
    last, more = second, flags > 2
    if THREE:
        last, more = _third(cand, col, w1, r1, w2, c2, from_c2, CAP, LINE), flags > 3
    return first, second, last, more


@triton.jit
def _probe_start(key, tag, mask, t_digests, num_buckets, CAP: tl.constexpr, LINE: tl.constexpr,
                 WORDS: tl.constexpr, POW2: tl.constexpr):
    """First half of the probe: (bucket's first slot, candidates, their columns)."""
    h = tagged_hash(key, tag)
    bucket = bucket_of_fast(h, num_buckets, POW2)
    cand, col = _candidates(t_digests, bucket, digest_of(h), mask, CAP, LINE, WORDS)
    return bucket * CAP, cand, col


@triton.jit
def _confirm_next(key, tag, t_keys, t_tags, base, cand, col, nxt, live, found, CAP: tl.constexpr,
                  WORDS: tl.constexpr):
    """Confirms candidate ``nxt`` where ``live``: (found, the candidates after it, the next)."""
    hit = _confirm(t_keys, t_tags, base + nxt, live & (nxt < CAP), key, tag)
    cand = _drop_through(cand, col, nxt, WORDS)
    return tl.where(hit, base + nxt, found), cand, _first_candidate(cand, col, WORDS, CAP)


@triton.jit
def _confirm_rest(key, tag, t_keys, t_tags, base, cand, col, nxt, live, found,
                  CAP: tl.constexpr, WORDS: tl.constexpr, ROUND: tl.constexpr):
    """Confirms the candidates from ``nxt`` on where ``live``, ``ROUND`` per loop round
    (their loads independent of each other: one round of memory latency)."""
    live = live & (nxt < CAP)
    while tl.max(live.to(tl.int32), axis=0) > 0:
        for _ in tl.static_range(ROUND):
            found, cand, nxt = _confirm_next(key, tag, t_keys, t_tags, base, cand, col, nxt,
                                             live, found, CAP, WORDS)
        live = live & (found < 0) & (nxt < CAP)
    return found


@triton.jit
def _probe_finish(key, tag, t_keys, t_tags, base, cand, col, CAP: tl.constexpr,
                  WORDS: tl.constexpr, ROUND: tl.constexpr, BY_WORD: tl.constexpr = 0):
    """Second half: the slot holding (key, tag) among the candidates, -1 when none does.

    The two lowest candidates are confirmed together; later ones ``ROUND`` per loop
    round. With BY_WORD (digest words only), the lowest come from ``_lowest`` and are
    confirmed together, two or three (BY_WORD 2 or 3); the later ones are looked for only
    in programs where a key still needs them."""
    if BY_WORD and WORDS:
        first, second, last, more = _lowest(cand, col, CAP, cand.shape[1], BY_WORD == 3)
    else:
        first = _first_candidate(cand, col, WORDS, CAP)
        cand = _drop_through(cand, col, first, WORDS)
        second = _first_candidate(cand, col, WORDS, CAP)
    hit1 = _confirm(t_keys, t_tags, base + first, first < CAP, key, tag)
    hit2 = _confirm(t_keys, t_tags, base + second, second < CAP, key, tag)
    found = tl.where(hit1, base + first, tl.where(hit2, base + second, -1))
    if BY_WORD == 3 and WORDS:  # the third lowest confirmed beside the first two
        hit3 = _confirm(t_keys, t_tags, base + last, last < CAP, key, tag)
        found = tl.where(hit3, base + last, found)  # a key is stored at most once
    if BY_WORD and WORDS:
        live = (found < 0) & more
        if tl.max(live.to(tl.int32), axis=0) > 0:
            cand = _drop_through(cand, col, last, WORDS)
            found = _confirm_rest(key, tag, t_keys, t_tags, base, cand, col,
                                  _first_candidate(cand, col, WORDS, CAP), live, found, CAP,
                                  WORDS, ROUND)
    else:
        cand = _drop_through(cand, col, second, WORDS)
        found = _confirm_rest(key, tag, t_keys, t_tags, base, cand, col,
                              _first_candidate(cand, col, WORDS, CAP), found < 0, found, CAP,
                              WORDS, ROUND)
    return found


@triton.jit
def line_masks(t_words, bucket, dig, mask, CAP: tl.constexpr, ORDERED: tl.constexpr = 0):
    """Slots of each key's bucket (at most 128, a multiple of 4; ``t_words`` the digest
    array as int32 words) whose digest is ``dig`` (0: the empty slots), as two 64-bit
    masks. The line is read in 16-byte chunks, a (keys, 4) tile each, so that a key's
    words sit in one thread and the masks are built without crossing threads.
    Unordered (a probe's candidates, in any order), bit p stands for slot column
    ``_mask_column(p)``: word j of chunk c moves its byte flags to bits j + 4 (c % 2) of
    each byte (the four words' bits never collide, so their sum is their union), and
    chunk pairs fill 32-bit groups. ORDERED: bit s stands for slot s, each word's flags
    gathered into a nibble by one multiply (a few operations more)."""
    j = tl.arange(0, 4)
    pattern = (dig.to(tl.uint32) * 0x01010101)[:, None]
    lo = tl.zeros(dig.shape, dtype=tl.uint64)
    hi = tl.zeros(dig.shape, dtype=tl.uint64)
    for c in tl.static_range(8):
        if c * 16 < CAP:
            word = c * 4 + j
            live = mask[:, None] & (word[None, :] < CAP // 4)
            words = tl.load(t_words + bucket[:, None] * (CAP // 4) + word[None, :], mask=live,
                            other=0).to(tl.uint32, bitcast=True)
            x = words ^ pattern
            low7 = (x & 0x7F7F7F7F) + 0x7F7F7F7F  # high bit set iff the low 7 bits are nonzero
            flags = ((low7 | x) & 0x80808080) ^ 0x80808080  # exact: 0x80 where bytes match
            flags = tl.where(live, flags, 0)  # words past the line match nothing
            if ORDERED:  # bits 0, 8, 16, 24 to bits 21-24, by products that never collide
                nibble = (((flags >> 7) * 0x204081) >> 21) & 0xF
                group = tl.sum(nibble << (4 * j).to(tl.uint32)[None, :], axis=1)
                group = group.to(tl.uint64) << (16 * (c % 4))
            else:
                shift = (7 - j - 4 * (c % 2)).to(tl.uint32)
                group = tl.sum(flags >> shift[None, :], axis=1).to(tl.uint64)
                group = group << (32 * ((c // 2) % 2))
            if c < 4:
                lo = lo | group
            else:
                hi = hi | group
    return lo, hi


@triton.jit
def _mask_column(p):
    """Slot column of bit p of an unordered ``line_masks`` pair: group p // 32, word
    p % 8 of the group's eight, byte (p // 8) % 4 of the word."""
    return (p // 32) * 32 + (p % 8) * 4 + (p // 8) % 4


@triton.jit
def pop_lowest(lo, hi, CAP: tl.constexpr, ORDERED: tl.constexpr = 0):
    """The slot column of the lowest bit of each ``line_masks`` pair (lo, hi) (CAP when
    both are 0) and the pair without it. A single bit's index is its float's exponent."""
    use_lo = lo != 0
    m = tl.where(use_lo, lo, hi)
    bit = m & (m ^ (m - 1))
    p = ((bit.to(tl.float32).to(tl.int32, bitcast=True) >> 23) & 0xFF) - 127
    p = p + tl.where(use_lo, 0, 64)
    if not ORDERED:
        p = _mask_column(p)
    column = tl.where(m != 0, p, CAP)
    rest = m ^ bit
    return column, tl.where(use_lo, rest, lo), tl.where(use_lo, hi, rest)


@triton.jit
def popcount64(x):
    """Set bits of each uint64."""
    x = x - ((x >> 1) & 0x5555555555555555)
    x = (x & 0x3333333333333333) + ((x >> 2) & 0x3333333333333333)
    x = (x + (x >> 4)) & 0x0F0F0F0F0F0F0F0F
    return ((x * 0x0101010101010101) >> 56).to(tl.int32)


@triton.jit
def _probe_masks(key, tag, mask, t_keys, t_tags, t_words, num_buckets, CAP: tl.constexpr,
                 POW2: tl.constexpr, LOWEST: tl.constexpr):
    """``probe_bucket`` from the masks of ``line_masks``: the ``LOWEST`` (2 or 3) lowest
    candidates confirmed together, any later ones one per loop round. A key is stored at
    most once, so the candidates' order does not change the answer."""
    h = tagged_hash(key, tag)
    bucket = bucket_of_fast(h, num_buckets, POW2)
    return _probe_line(key, tag, mask, t_keys, t_tags, t_words, bucket, digest_of(h), CAP,
                       LOWEST)


@triton.jit
def _probe_segments(key, tag, mask, t_keys, t_tags, t_words, num_buckets, CAP: tl.constexpr,
                    POW2: tl.constexpr, LOWEST: tl.constexpr):
    """``probe_bucket`` of buckets wider than 128 slots (a multiple of 128, such as the
    admission counters' 1,024): the bucket read as 128-slot segments, each probed as
    ``_probe_masks`` probes a bucket, in order until the key is found; segment s of
    bucket b is the 128-slot line b * (CAP // 128) + s, whose slots are those of the
    bucket. A key's probe stops at the segment holding it, a miss reads every one."""
    h = tagged_hash(key, tag)
    bucket = bucket_of_fast(h, num_buckets, POW2)
    dig = digest_of(h)
    segments: tl.constexpr = CAP // 128
    found = tl.zeros_like(key).to(tl.int64) - 1
    live = mask
    for s in range(segments):
        if tl.max(live.to(tl.int32), axis=0) > 0:
            slot = _probe_line(key, tag, live, t_keys, t_tags, t_words, bucket * segments + s,
                               dig, 128, LOWEST)
            found = tl.where(slot >= 0, slot, found)
            live = live & (slot < 0)
    return found


@triton.jit
def _probe_line(key, tag, mask, t_keys, t_tags, t_words, bucket, dig, CAP: tl.constexpr,
                LOWEST: tl.constexpr):
    """The slot of each (key, tag) among the ``dig`` matches of line ``bucket`` (CAP
    slots, at most 128), -1 when none holds it."""
    lo, hi = line_masks(t_words, bucket, dig, mask, CAP)
    base = bucket * CAP
    first, lo, hi = pop_lowest(lo, hi, CAP)
    second, lo, hi = pop_lowest(lo, hi, CAP)
    hit1 = _confirm(t_keys, t_tags, base + first, first < CAP, key, tag)
    hit2 = _confirm(t_keys, t_tags, base + second, second < CAP, key, tag)
    found = tl.where(hit1, base + first, tl.where(hit2, base + second, -1))
    if LOWEST == 3:
        third, lo, hi = pop_lowest(lo, hi, CAP)
        hit3 = _confirm(t_keys, t_tags, base + third, third < CAP, key, tag)
        found = tl.where(hit3, base + third, found)
    live = (found < 0) & ((lo | hi) != 0)
    while tl.max(live.to(tl.int32), axis=0) > 0:
        nxt, lo, hi = pop_lowest(lo, hi, CAP)
        hit = _confirm(t_keys, t_tags, base + nxt, live & (nxt < CAP), key, tag)
        found = tl.where(hit, base + nxt, found)
        live = live & (found < 0) & ((lo | hi) != 0)
    return found


@triton.jit
def probe_bucket(key, tag, mask, t_keys, t_tags, t_digests, num_buckets, CAP: tl.constexpr,
                 LINE: tl.constexpr, WORDS: tl.constexpr, POW2: tl.constexpr,
                 ROUND: tl.constexpr, BY_WORD: tl.constexpr = 0, MASKS: tl.constexpr = 0):
    """Slot of each (key, tag) in its bucket, -1 when absent: (BLOCK,) int64.

    A key is stored at most once, so any full match is the answer; the two lowest
    digest matches are confirmed together, later ones ROUND per loop round
    (``probe_round``). BY_WORD: see ``_probe_finish`` (``WORD_PROBE``). MASKS (digest
    words, ``probe_masks``): the matches as bit masks (``_probe_masks``), the lowest
    ``BY_WORD`` of them (3, else 2) confirmed together; buckets wider than 128 slots by
    128-slot segments (``_probe_segments``).
    """
    if MASKS and WORDS and CAP <= 128:
        return _probe_masks(key, tag, mask, t_keys, t_tags, t_digests, num_buckets, CAP, POW2,
                            3 if BY_WORD == 3 else 2)
    if MASKS and WORDS and CAP % 128 == 0:
        return _probe_segments(key, tag, mask, t_keys, t_tags, t_digests, num_buckets, CAP,
                               POW2, 3 if BY_WORD == 3 else 2)
    base, cand, col = _probe_start(key, tag, mask, t_digests, num_buckets, CAP, LINE, WORDS,
                                   POW2)
    return _probe_finish(key, tag, t_keys, t_tags, base, cand, col, CAP, WORDS, ROUND, BY_WORD)


# n is not specialized, so a batch's key count compiles no variant of its own. With n
# specialized (divisible by 16 or not) and every row masked by it, find of 1M keys at dim
# 128 ran 12% faster than unspecialized (benchmarks/results/compile_variants.md): each
# row had its own mask predicate, and the kernel spilled under its 80-register cap.
# SHIFT (rows of 128 columns, calls of at least BLOCK keys) masks no row instead: the
# last program starts BLOCK keys before the end, finding again some keys the program
# before it found and writing the same slots and rows there. Compiled for sm_90 at the
# benchmark launches (registers / stack bytes / SASS instructions): dim 128, 16 keys a
# program: 76 / 0 / 624 shifted, 76 / 0 / 656 masked with n divisible by 16, 80 / 72 /
# 840 masked unspecialized; dim 64, 32 keys: shifted spills (80 / 56 / 744), masked
# unspecialized does not (80 / 0 / 744; 720 with n divisible); dims 8 and 32: masked
# unspecialized 552 and 640 instructions, 552 and 632 divisible, no stack. On an H200,
# 1M keys a call (divisible by 16), dims 8-128 and load factors 0.5-1.0, find ran as fast
# as with n specialized, within 0.5% at every setting in two runs of each
# (benchmarks/results/find_shifted.md).
@fast_launch
@triton.jit(do_not_specialize=["n"])
def _find_kernel(keys_ptr, tags_ptr, t_keys, t_tags, t_digests, t_values, out_slots,
                 out_values, n, num_buckets, HAS_TAGS: tl.constexpr, WITH_VALUES: tl.constexpr,
                 CAP: tl.constexpr, LINE: tl.constexpr, WORDS: tl.constexpr,
                 POW2: tl.constexpr, ROUND: tl.constexpr, ROW_DIM: tl.constexpr,
                 DIM: tl.constexpr, DIM_P2: tl.constexpr, BY_WORD: tl.constexpr,
                 MASKS: tl.constexpr, SHIFT: tl.constexpr, BLOCK: tl.constexpr):
    """Slots (and rows) of BLOCK keys. Each row is read once its key is confirmed
    (reading the row at the lowest digest match beside the confirming loads was 10-30%
    slower on an H200: ``benchmarks/results/find_speculate_gpu.md``)."""
    if SHIFT:  # n >= BLOCK
        offs = tl.minimum(tl.program_id(0).to(tl.int64) * BLOCK, n - BLOCK) \
            + tl.arange(0, BLOCK)
        mask = tl.full([BLOCK], 1, tl.int1)
    else:
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
    key = tl.load(keys_ptr + offs, mask=mask, other=0)
    tag = load_tags(tags_ptr, offs, mask, HAS_TAGS)
    slot = probe_bucket(key, tag, mask, t_keys, t_tags, t_digests, num_buckets, CAP, LINE,
                        WORDS, POW2, ROUND, BY_WORD, MASKS)
    tl.store(out_slots + offs, slot, mask=mask)
    if WITH_VALUES:
        col = tl.arange(0, DIM_P2)
        cmask = col[None, :] < DIM
        found = (slot >= 0)[:, None] & cmask
        row = tl.load(t_values + slot[:, None] * ROW_DIM + col[None, :], mask=found, other=0.0)
        tl.store(out_values + offs[:, None] * DIM + col[None, :], row,
                 mask=mask[:, None] & cmask)  # SHIFT: mask is constant, folded away


# (keys per program, warps, and optionally "maxnreg": registers a thread at most) of the
# find launch; None picks by row width and bucket (``_config``). Benchmarks may set it.
FIND_CONFIG: dict | None = None
# Slots or rows of up to 64 columns from buckets of up to 128 slots: 32 keys a program
# on one warp, at most 80 registers a thread (uncapped, the probe takes 96, at 31%
# occupancy), probing by word (``WORD_PROBE``). On an H200, find of 1M keys into 64M
# slots ran 7-11% faster at dim 8 and 11-17% at dim 32 than at 64 keys on 2 warps
# uncapped, the earlier choice (benchmarks/results/table_gpu_find_configs.md); with the
# probe by word, 11-12% faster at dim 64 than 64 keys on 4 warps by position
# (find_sweep_word_gpu.md). Rows of 128 columns took twice as long at this cap.
NARROW_FIND = {"block": 32, "num_warps": 1, "maxnreg": 80, "by_word": True}
# Rows of 128 columns from buckets of up to 128 slots: 16 keys a program on one warp, at
# most 80 registers a thread, by word. On an H200 it ran 1.05 / 1.07 / 1.08x as fast as
# 64 keys on 4 warps by position, the earlier choice, at load factors 0.5 / 0.75 / 1.0
# (3.84 / 3.78 / 3.71 B-KV/s: table_gpu_dim128.md, same run; 1.00-1.03x in the sweep
# find_sweep_block16_gpu.md). Other rows keep 64 keys on 4 warps (2 up to 32 columns),
# uncapped, by position.
ROWS128_FIND = {"block": 16, "num_warps": 1, "maxnreg": 80, "by_word": True}


# Buckets of at least this many slots confirm their later digest matches four per probe
# round instead of one (0: never), where a probe reads a (keys, line) tile. An 8-bit
# digest matches about cap / 256 slots of a full bucket at random: some four in the
# admission counters' 1,024-slot buckets, each a dependent key load when confirmed one at
# a time. Off: on an H200 the tile probe of 1,024-slot counter buckets ran find 1.4-1.6x
# and the admission count 1.3-1.4x slower with it (benchmarks/results/admission_gpu.md,
# "tile4" against "tile"); such buckets are now probed by segments (``_probe_segments``),
# 11-12x faster than the tile, and the setting reaches only other wide buckets.
WIDE_PROBE_MIN_CAP = max(0, env_int("HASHREC_WIDE_PROBE_MIN_CAP", 0))


# The probe's two lowest digest matches from reductions over the digest words (the lowest
# matching word, the next one and a flag count: ``_lowest``) instead of three passes
# that place every matching digest. Results are the same. On an H200, 1M keys into 64M
# slots (benchmarks/results/table_gpu_word_probe.md against table_gpu_by_position.md,
# one run), find ran 1.10-1.26x faster at dim 8 and 1.15-1.28x at dim 32, the same at
# dim 128 and 4-7% slower at dim 64 (64 keys on 4 warps); the upsert's probe 1.00-1.03x.
# So the narrow find launch (NARROW_FIND, now also dim 64) and the upsert's probe take
# it; rows of 128 columns take it at 16 keys a program (ROWS128_FIND), where it is
# faster, and wider buckets and rows do not. HASHREC_WORD_PROBE=1 or 0 sets it for every
# probe; None keeps each launch's choice.
_WORD_PROBE_ENV = os.environ.get("HASHREC_WORD_PROBE", "").strip()
if _WORD_PROBE_ENV not in ("", "0", "1"):
    raise ValueError("HASHREC_WORD_PROBE must be 0 (by position) or 1 (by word), got "
                     f"{_WORD_PROBE_ENV!r}")
WORD_PROBE: bool | None = None if _WORD_PROBE_ENV == "" else _WORD_PROBE_ENV == "1"
# How many of the lowest digest matches a probe by word finds and confirms together, 2 or
# 3 (HASHREC_WORD_PROBE_LOWEST). With 8-bit digests a key of a full 128-slot bucket has
# about half a false match on average, so some 2% of keys need a third, and at 32 keys a
# program about half the programs wait on one more dependent load for them; the third
# costs two more reductions over the line. On an H200 (table_gpu_probe_lowest3.md against
# _lowest2.md, one run), three made find 1.02-1.06x faster at load factor 1.0 (tables of
# fixed capacity, full and evicting, run there) and 4-9% slower at 0.5, so two is the
# default. Three only in programs where a key has three matches or more (a branch on a
# reduction) made find 1.8x slower (_lowest4.md), and was dropped.
WORD_PROBE_LOWEST = env_int("HASHREC_WORD_PROBE_LOWEST", 2)
if WORD_PROBE_LOWEST not in (2, 3):
    raise ValueError(f"HASHREC_WORD_PROBE_LOWEST must be 2 or 3, got {WORD_PROBE_LOWEST}")


# The probe's digest matches as two 64-bit masks, each key's line read in 16-byte chunks
# by the thread that holds the key (``line_masks``), instead of a (keys, line) tile
# whose reductions cross threads: buckets of up to 128 slots whose digests are read as
# words. HASHREC_MASK_PROBE=0 keeps the tile (in the probe and in the upsert's lane
# form). Results are the same. On an H200, find of 1M keys (60% present) into 64M slots
# ran 1.34 / 1.41 / 1.70x as fast as from the tile at dim 8, load factors 0.5 / 0.75 /
# 1.0 (12.7 / 11.2 / 11.9 B-KV/s), 1.11 / 1.24 / 1.35x at dim 32, 1.04-1.13x at dim 64
# and 1.01-1.02x at dim 128 (benchmarks/results/table_gpu_337e5cd.md against
# table_gpu_tile.md, same call); a counter profile of the tile probe had shown it bound
# by instruction issue (64% of the multiprocessors' throughput, 38-47% of the memory's:
# table_gpu_profile_tile_probe.log).
MASK_PROBE = env_int("HASHREC_MASK_PROBE", 1)
if MASK_PROBE not in (0, 1):
    raise ValueError(f"HASHREC_MASK_PROBE must be 0 (tile) or 1 (masks), got {MASK_PROBE}")


def mask_probe(cap: int, words: bool) -> bool:
    """Whether a ``cap``-slot bucket's whole line fits one pair of ``line_masks`` (up to
    128 slots, digests read as words): the lane form's empty slots."""
    return bool(MASK_PROBE) and words and cap <= 128


def probe_masks(cap: int, words: bool) -> bool:
    """Whether a probe of ``cap``-slot buckets takes masks: a line that fits one pair
    (``mask_probe``) whole, a wider one that is a multiple of 128 slots by segments."""
    return mask_probe(cap, words) or (bool(MASK_PROBE) and words and cap % 128 == 0)


def probe_width(cap: int, width: int, words: bool) -> int:
    """The digest tile width that sizes a probe launch (``probe_block``): a probe by masks
    holds 16-byte chunks, not the line, so a segmented bucket counts as 128 slots."""
    return min(width, 32) if probe_masks(cap, words) else width


def by_word(default: bool) -> int:
    """The BY_WORD of a probe whose launch picks ``default``: 0 (by position) or how many
    lowest matches it finds by word."""
    return WORD_PROBE_LOWEST if (default if WORD_PROBE is None else WORD_PROBE) else 0


def probe_round(cap: int) -> int:
    """Later digest matches a probe of a ``cap``-slot bucket confirms per round."""
    return 4 if WIDE_PROBE_MIN_CAP and cap >= WIDE_PROBE_MIN_CAP else 1


def _config(dim_p2: int, width: int) -> dict:
    if FIND_CONFIG is not None:
        return FIND_CONFIG
    if width <= 32 and dim_p2 <= 64:
        return NARROW_FIND
    if width <= 32 and dim_p2 == 128:
        return ROWS128_FIND
    return {"block": 64, "num_warps": 4 if dim_p2 > 32 else 2}


def probe_block(width: int, num_warps: int = 2, limit: int = 64) -> int:
    """Keys per program of a probe over digest lines ``width`` elements wide: at most
    ``limit``, and few enough that the (keys, width) digest tile stays near 32 values
    per thread (wide buckets, such as the admission counters' 1,024 slots, would
    otherwise spill registers)."""
    return max(1, min(limit, 32 * 32 * num_warps // width))


def digest_line(storage: TableStorage) -> tuple[torch.Tensor, int, bool]:
    """The digest array as the probe reads it: (tensor, line width, as 32-bit words)."""
    digests, cap = storage.digests, storage.bucket_capacity
    if cap % 4 == 0 and digests.storage_offset() % 4 == 0 and digests.is_contiguous():
        return digests.view(torch.int32), next_pow2(cap // 4), True
    return digests, next_pow2(cap), False


def launch_find(storage: TableStorage, keys: torch.Tensor, tags: torch.Tensor | None,
                slots: torch.Tensor, values: torch.Tensor | None = None,
                config: dict | None = None) -> None:
    """Runs the find kernel into preallocated ``slots`` (n,) and optional ``values``
    (n, dim); no validation, no allocation, no host sync (hot paths call this)."""
    n = keys.numel()
    if n == 0:
        return
    line, width, words = digest_line(storage)
    cap = storage.bucket_capacity
    tile = probe_width(cap, width, words)
    dim = values.shape[1] if values is not None else 1
    dim_p2 = next_pow2(dim)
    config = config or _config(dim_p2, tile)
    block = min(probe_block(tile, config["num_warps"], config["block"]),
                max(1, 16384 // dim_p2))
    _find_kernel[(cdiv(n, block),)](
        keys, tags if tags is not None else keys, storage.keys, storage.probe_tags(tags),
        line, storage.values, slots, values if values is not None else slots, n,
        storage.num_buckets, HAS_TAGS=tags is not None, WITH_VALUES=values is not None,
        CAP=cap, LINE=width, WORDS=words,
        POW2=is_pow2(storage.num_buckets), ROUND=probe_round(cap),
        ROW_DIM=storage.row_dim, DIM=dim, DIM_P2=dim_p2,
        BY_WORD=by_word(config.get("by_word", False)),
        MASKS=probe_masks(cap, words), SHIFT=n >= block and dim_p2 >= 128,
        BLOCK=block,
        num_warps=config["num_warps"],
        **maxnreg(config.get("maxnreg", 0)))


def _launch(storage: TableStorage, keys: torch.Tensor, tags: torch.Tensor | None,
            dim: int | None) -> tuple[torch.Tensor, torch.Tensor | None]:
    check_keys(keys, tags, storage.device)
    keys = keys.contiguous()
    tags = tags.contiguous() if tags is not None else None
    slots = torch.empty(keys.numel(), dtype=torch.int64, device=keys.device)
    values = None
    if dim is not None:
        if not 0 < dim <= storage.row_dim:
            raise ValueError(f"dim={dim} must be in [1, row_dim={storage.row_dim}]")
        values = torch.empty(keys.numel(), dim, dtype=storage.values.dtype, device=keys.device)
    launch_find(storage, keys, tags, slots, values)
    return slots, values


def find_slots(storage: TableStorage, keys: torch.Tensor,
               tags: torch.Tensor | None = None) -> torch.Tensor:
    """Slots of keys: (n,) int64 [+ (n,) int32 tags] -> (n,) int64, -1 where absent."""
    return _launch(storage, keys, tags, None)[0]


def find_values(storage: TableStorage, keys: torch.Tensor, tags: torch.Tensor | None = None,
                dim: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Slots and the first ``dim`` value columns of keys in one pass.

    Returns ``(slots (n,) int64 with -1 where absent, values (n, dim))``; rows of
    absent keys are zero. ``dim`` defaults to the full row.
    """
    slots, values = _launch(storage, keys, tags, dim or storage.row_dim)
    return slots, values
