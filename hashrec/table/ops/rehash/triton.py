"""Triton rehash: one program per old bucket splits its entries over the new buckets.

Where the new bucket count is a multiple of the old one (a split), each new bucket
receives the entries of one old bucket only (``reference.py``) and the old buckets split
independently: no probing, no atomics, no sort. An entry's slot in its new bucket is its
rank among the old bucket's entries sent there, in old slot order, as in the reference;
the rows move in the same program. Other growths (a table's last, to a max_capacity
whose bucket count is no multiple) run the reference's torch ops.
"""

from __future__ import annotations

import triton
import triton.language as tl

from hashrec.table._triton_hash import bucket_of_fast, is_pow2, load_tags, tagged_hash
from hashrec.table.ops.launch import fast_launch, next_pow2
from hashrec.table.ops.rehash import reference
from hashrec.table.storage import TableStorage

_CHUNK = 32  # columns of the (entry, entry) comparison taken at a time
_ROW_BLOCK = 64  # row elements moved at a time


@triton.jit
def _entries(o_keys, o_tags, o_digests, slots, new_buckets, HAS_TAGS: tl.constexpr,
             POW2: tl.constexpr):
    """(occupied, key, tag, new bucket) of the old entries at ``slots``."""
    occupied = tl.load(o_digests + slots) != 0
    key = tl.load(o_keys + slots, mask=occupied, other=0)
    tag = load_tags(o_tags, slots, occupied, HAS_TAGS)
    bucket = bucket_of_fast(tagged_hash(key, tag), new_buckets, POW2)
    return occupied, key, tag, bucket


@fast_launch
@triton.jit
def _split_kernel(o_keys, o_tags, o_digests, o_scores, o_values,
                  n_keys, n_tags, n_digests, n_scores, n_values,
                  new_buckets, row_dim, CAP: tl.constexpr, CHUNK: tl.constexpr,
                  ROW_BLOCK: tl.constexpr, HAS_TAGS: tl.constexpr, POW2: tl.constexpr):
    base = tl.program_id(0).to(tl.int64) * CAP
    cols = tl.arange(0, CAP)
    occupied, key, tag, bucket = _entries(o_keys, o_tags, o_digests, base + cols,
                                          new_buckets, HAS_TAGS, POW2)
    # Rank of each entry among the earlier ones going to its new bucket, counted over
    # CHUNK columns at a time (the columns' entries read again: one line each, cached).
    rank = tl.zeros([CAP], dtype=tl.int32)
    for first in tl.static_range(0, CAP, CHUNK):
        other = first + tl.arange(0, CHUNK)
        o_occ, _, _, o_bucket = _entries(o_keys, o_tags, o_digests, base + other,
                                         new_buckets, HAS_TAGS, POW2)
        before = ((other[None, :] < cols[:, None]) & o_occ[None, :]
                  & (o_bucket[None, :] == bucket[:, None]))
        rank += tl.sum(before.to(tl.int32), axis=1)
    slot = bucket * CAP + rank
    tl.store(n_keys + slot, key, mask=occupied)
    if HAS_TAGS:
        tl.store(n_tags + slot, tag, mask=occupied)
    tl.store(n_digests + slot, tl.load(o_digests + base + cols), mask=occupied)
    tl.store(n_scores + slot, tl.load(o_scores + base + cols), mask=occupied)
    start = row_dim * 0  # a run-time zero: the loop below carries it
    while start < row_dim:  # while, not range: the loop bound is a run-time value
        at = start + tl.arange(0, ROW_BLOCK)
        mask = occupied[:, None] & (at < row_dim)[None, :]
        row = tl.load(o_values + (base + cols)[:, None] * row_dim + at[None, :], mask=mask)
        tl.store(n_values + slot[:, None] * row_dim + at[None, :], row, mask=mask)
        start += ROW_BLOCK


def rehash(storage: TableStorage, num_buckets: int) -> TableStorage:
    """Returns a storage with ``num_buckets`` buckets (at least the old count) holding
    the entries of ``storage``, slot for slot as the reference places them."""
    cap = storage.bucket_capacity
    reference.check_growth(storage, num_buckets)
    if num_buckets % storage.num_buckets:
        return reference.rehash(storage, num_buckets)  # a last growth: not a split
    if next_pow2(cap) != cap or not storage.values.is_contiguous():
        return reference.rehash(storage, num_buckets)  # bucket widths the tile cannot take
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
