"""How a table's bucket count starts and grows from ``init_capacity`` to ``max_capacity``.

Growth rehashes into a whole multiple of the bucket count (each old bucket splits over
the new ones), so the counts on the way are divisors of the final one: the table starts
at the smallest divisor that holds ``init_capacity`` and grows by doubling where the
final count allows, else by its smallest factor left.
"""

from __future__ import annotations

import logging
import math

from hashrec.table.options import TableOptions

logger = logging.getLogger("hashrec.table.hash_table")


def _smallest_factor(n: int) -> int:
    """The smallest factor > 1 of ``n`` >= 2 (``n`` itself when prime)."""
    factor = 2
    while factor * factor <= n:
        if n % factor == 0:
            return factor
        factor += 1
    return n


def initial_buckets(options: TableOptions) -> tuple[int, int]:
    """(initial, max) bucket counts: the initial count is the smallest divisor of the max
    count that holds ``init_capacity``, so that growth (``next_buckets``) reaches the max
    count exactly with each count a multiple of the one before (what rehash needs)."""
    bc = options.bucket_capacity
    max_buckets = math.ceil(options.max_capacity / bc)
    wanted = math.ceil((options.init_capacity or options.max_capacity) / bc)
    initial, divisor = max_buckets, 1
    while divisor * divisor <= max_buckets:
        if max_buckets % divisor == 0:
            for count in (divisor, max_buckets // divisor):
                if wanted <= count < initial:
                    initial = count
        divisor += 1
    return initial, max_buckets


def next_buckets(num_buckets: int, max_buckets: int) -> int:
    """The bucket count growth goes to from ``num_buckets`` (a divisor of ``max_buckets``):
    twice as many where the max count allows, else the smallest multiple that divides it."""
    return num_buckets * _smallest_factor(max_buckets // num_buckets)


def note_init_capacity_unmet(options: TableOptions, initial: int) -> None:
    """Logs (INFO) when the initial allocation is more than twice ``init_capacity``: the bucket
    count of max_capacity has no divisor near it (growth must multiply up to it)."""
    start = initial * options.bucket_capacity
    if options.init_capacity is None or start <= 2 * options.init_capacity:
        return
    max_buckets = math.ceil(options.max_capacity / options.bucket_capacity)
    logger.info(
        "table %r: init_capacity=%d allocates %d slots: the table grows by whole multiples "
        "up to max_capacity's %d buckets of %d, and %d has no divisor between %d and %d. "
        "Pick a max_capacity whose bucket count has small factors (e.g. a multiple of "
        "bucket_capacity * 2**k) to start near init_capacity.", options.name,
        options.init_capacity, start, max_buckets, options.bucket_capacity, max_buckets,
        math.ceil(options.init_capacity / options.bucket_capacity), initial)
