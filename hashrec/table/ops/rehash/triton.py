"""Triton rehash: one program per old bucket splits its entries over the new buckets.

With the new bucket count a multiple of the old one, an entry of old bucket ``b``
goes to a bucket congruent to ``b`` (bucket = bits 0..31 of the hash modulo the
count), so each new bucket receives entries of one old bucket only and the old
buckets can be split independently: no probing, no atomics, nothing sorted on the
host. Within its new bucket an entry takes the slot given by its rank among the
entries sent there, ordered as the reference insert orders a bucket's incoming
keys (score descending, key ascending, then old slot), so the result equals the
reference rehash slot for slot. The rows move in the same program. Any other
bucket count falls back to the reference.
"""

from __future__ import annotations

import triton
import triton.language as tl

from hashrec.table._triton_hash import bucket_of_fast, is_pow2, load_tags, tagged_hash
from hashrec.table.ops.launch import fast_launch, next_pow2
from hashrec.table.ops.rehash import reference
from hashrec.table.storage import TableStorage

_CHUNK = 16  # columns of the (entry, entry) order compared at a time
_ROW_BLOCK = 64  # row elements moved at a time


@triton.jit
def _entries(o_keys, o_tags, o_digests, o_scores, slots, new_buckets,
             HAS_TAGS: tl.constexpr, POW2: tl.constexpr):
    """(occupied, key, tag, score, new bucket) of the old entries at ``slots``."""
    occupied = tl.load(o_digests + slots) != 0
    key = tl.load(o_keys + slots, mask=occupied, other=0)
    tag = load_tags(o_tags, slots, occupied, HAS_TAGS)
    score = tl.load(o_scores + slots, mask=occupied, other=0)
    bucket = bucket_of_fast(tagged_hash(key, tag), new_buckets, POW2)
    return occupied, key, tag, score, bucket


@fast_launch
@triton.jit
def _split_kernel(o_keys, o_tags, o_digests, o_scores, o_values,
                  n_keys, n_tags, n_digests, n_scores, n_values,
                  new_buckets, row_dim, CAP: tl.constexpr, CHUNK: tl.constexpr,
                  ROW_BLOCK: tl.constexpr, HAS_TAGS: tl.constexpr, POW2: tl.constexpr):
    base = tl.program_id(0).to(tl.int64) * CAP
    cols = tl.arange(0, CAP)
    occupied, key, tag, score, bucket = _entries(o_keys, o_tags, o_digests, o_scores,
                                                 base + cols, new_buckets, HAS_TAGS, POW2)
    # Rank of each entry among those going to its new bucket: how many come before it
    # in (score desc, key asc, slot asc), counted over CHUNK columns at a time.
    rank = tl.zeros([CAP], dtype=tl.int32)
    for first in tl.static_range(0, CAP, CHUNK):
        other = first + tl.arange(0, CHUNK)
        o_occ, o_key, _, o_score, o_bucket = _entries(o_keys, o_tags, o_digests, o_scores,
                                                      base + other, new_buckets, HAS_TAGS,
                                                      POW2)
        ahead = (o_score[None, :] > score[:, None]) | (
            (o_score[None, :] == score[:, None])
            & ((o_key[None, :] < key[:, None])
               | ((o_key[None, :] == key[:, None]) & (other[None, :] < cols[:, None]))))
        before = ahead & o_occ[None, :] & (o_bucket[None, :] == bucket[:, None])
        rank += tl.sum(before.to(tl.int32), axis=1)
    slot = bucket * CAP + rank
    tl.store(n_keys + slot, key, mask=occupied)
    if HAS_TAGS:
        tl.store(n_tags + slot, tag, mask=occupied)
    tl.store(n_digests + slot, tl.load(o_digests + base + cols), mask=occupied)
    tl.store(n_scores + slot, score, mask=occupied)
    start = row_dim * 0
    while start < row_dim:  # while, not range: the loop bound is a run-time value
        at = start + tl.arange(0, ROW_BLOCK)
        mask = occupied[:, None] & (at < row_dim)[None, :]
        row = tl.load(o_values + (base + cols)[:, None] * row_dim + at[None, :], mask=mask)
        tl.store(n_values + slot[:, None] * row_dim + at[None, :], row, mask=mask)
        start += ROW_BLOCK


def rehash(storage: TableStorage, num_buckets: int) -> TableStorage:
    """Returns a storage with ``num_buckets`` buckets holding every entry of ``storage``,
    as the reference would place them (see the module docstring)."""
    cap = storage.bucket_capacity
    if (num_buckets % storage.num_buckets or next_pow2(cap) != cap
            or not storage.values.is_contiguous()):
        return reference.rehash(storage, num_buckets)
    grown = TableStorage.empty(num_buckets, cap, storage.row_dim, storage.values.dtype,
                               storage.device)
    grown.tagged = storage.tagged
    _split_kernel[(storage.num_buckets,)](
        storage.keys, storage.tags, storage.digests, storage.scores, storage.values,
        grown.keys, grown.tags, grown.digests, grown.scores, grown.values,
        num_buckets, storage.row_dim, CAP=cap, CHUNK=min(_CHUNK, cap),
        ROW_BLOCK=min(_ROW_BLOCK, max(next_pow2(storage.row_dim), 1)),
        HAS_TAGS=storage.tagged, POW2=is_pow2(num_buckets), num_warps=4)
    return grown
