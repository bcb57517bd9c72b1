"""Device-side probe of one bucket: digest match, then key + tag compare.

The ``@triton.jit`` helpers that find, the upsert's probe and the admission count
share; ``probe_bucket`` is their entry point. Which form a launch takes (digest masks,
128-slot segments, a (keys, line) tile reduced by word or read by position) is the
launcher's choice, from the settings in ``find/triton.py``, whose docstring describes
the forms.
"""

from __future__ import annotations

import triton
import triton.language as tl

from hashrec.table._triton_hash import bucket_of_fast, digest_of, tagged_hash


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
