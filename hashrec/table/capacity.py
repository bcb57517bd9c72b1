"""How a table's bucket count starts and grows from ``init_capacity`` to ``max_capacity``.

A table starts at ``init_capacity`` rounded up to whole buckets and doubles while twice
its count leaves at least 1.5 times as many for the last growth, which goes to
``max_capacity``'s count exactly (a growth of 1.5x to 3x). A growth to a multiple of
the bucket count splits each bucket over the new ones (nothing can overflow); the last
one, where max_capacity's count is not such a multiple, places every entry in its new
bucket afresh (``hashrec.table.ops.rehash``), where a bucket that receives more entries
than it has slots keeps its highest-scored ones, as inserts at max_capacity evict.
"""

from __future__ import annotations

import math

from hashrec.table.options import TableOptions

# The least growth of the last step: with the table at its 0.75 load factor before it,
# a bucket then expects at most half its slots, which 128-slot buckets overflow only
# with a probability of about 1e-12.
LAST_GROWTH = 1.5


def initial_buckets(options: TableOptions) -> tuple[int, int]:
    """(initial, max) bucket counts: ``init_capacity`` rounded up to whole buckets, or the
    max count where that leaves less than ``LAST_GROWTH`` to grow (a growth of less
    could crowd buckets)."""
    bc = options.bucket_capacity
    max_buckets = math.ceil(options.max_capacity / bc)
    wanted = math.ceil((options.init_capacity or options.max_capacity) / bc)
    if wanted * LAST_GROWTH > max_buckets:
        return max_buckets, max_buckets
    return wanted, max_buckets


def next_buckets(num_buckets: int, max_buckets: int) -> int:
    """The bucket count growth goes to from ``num_buckets`` (< ``max_buckets``): the max
    count where that is at most 3x (a split where it is a multiple), else twice as many
    where that leaves ``LAST_GROWTH`` for the last growth, else the max count."""
    if max_buckets % num_buckets == 0 and max_buckets // num_buckets <= 3:
        return max_buckets
    if 2 * num_buckets * LAST_GROWTH <= max_buckets:
        return 2 * num_buckets
    return max_buckets


COUNTER_SEGMENT = 128  # slots of a bucket segment the GPU probe reads at once


def counter_layout(capacity: int, bucket_capacity: int) -> tuple[int, int]:
    """(buckets, slots per bucket) of a counter table asked for ``capacity`` slots in
    buckets of at most ``bucket_capacity``: the fewest buckets that hold them, each of
    ceil(capacity / buckets) slots rounded up to a multiple of gcd(bucket_capacity, 128),
    so that the total exceeds ``capacity`` by less than one such multiple a bucket.

    Example::

        counter_layout(2500, 1024) == (3, 896)    # 2688 slots (1024-slot buckets: 3072)
        counter_layout(500, 1024) == (1, 512)
        counter_layout(4096, 1024) == (4, 1024)
    """
    buckets = math.ceil(capacity / bucket_capacity)
    grain = math.gcd(bucket_capacity, COUNTER_SEGMENT)
    slots = math.ceil(math.ceil(capacity / buckets) / grain) * grain
    return buckets, min(slots, bucket_capacity)
