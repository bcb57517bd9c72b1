"""Memory accounting of a dynamic table (the storage estimate of TorchEasyRec's DynamicEmb
integration).

Per table, with ``rows`` = max_capacity rounded up to whole buckets::

    value_bytes_per_row = round_up16(row_dim * element_size)   # embedding + optimizer state
    index_bytes         = rows * (key 8 + score 8 + digest 1 + tag 4)
                          + num_buckets * bucket header 4
    HBM_ONLY: gpu = values + index                       host = 0
    HYBRID:   gpu = cache_load_factor * values + index   host = (1 - cache_load_factor) * values
    CACHING:  gpu = cache_load_factor * values + index   host = values
    admission counters (key 8 + tag 4 + digest 1 + count 8 per counter slot) are on the gpu.

The 4-byte tag is this layout's namespace column (table fusion); the bucket header
is kept from that estimate so plans stay comparable. On a CPU-only machine the
"gpu" share is host memory standing in for it.
"""

from __future__ import annotations

import math

import torch

from hashrec.table.capacity import counter_layout
from hashrec.table.options import StorageMode, TableOptions

KEY_BYTES = 8
SCORE_BYTES = 8
DIGEST_BYTES = 1
TAG_BYTES = 4
BUCKET_HEADER_BYTES = 4
ROW_ALIGN_BYTES = 16


def _round_up(value: int, multiple: int) -> int:
    return (value + multiple - 1) // multiple * multiple


def _counter_bytes(options: TableOptions) -> int:
    if options.admission is None:
        return 0
    capacity = options.admission.counter_capacity or options.max_capacity
    buckets, per_bucket = counter_layout(capacity, options.admission.counter_bucket_capacity)
    slots = buckets * per_bucket
    return slots * (KEY_BYTES + TAG_BYTES + DIGEST_BYTES + SCORE_BYTES)


def estimate_table_bytes(options: TableOptions) -> dict[str, int | str]:
    """Bytes one table needs at max_capacity: {"gpu", "host", "values", "index", "mode"}."""
    num_buckets = math.ceil(options.max_capacity / options.bucket_capacity)
    rows = num_buckets * options.bucket_capacity
    element = torch.empty(0, dtype=options.dtype).element_size()
    values = rows * _round_up(options.row_dim * element, ROW_ALIGN_BYTES)
    index = (rows * (KEY_BYTES + SCORE_BYTES + DIGEST_BYTES + TAG_BYTES)
             + num_buckets * BUCKET_HEADER_BYTES + _counter_bytes(options))
    mode = options.storage_mode
    cached = int(options.cache_load_factor * values)
    if mode is StorageMode.HBM_ONLY:
        gpu, host = values + index, 0
    elif mode is StorageMode.HYBRID:
        gpu, host = cached + index, values - cached
    else:
        gpu, host = cached + index, values
    return {"gpu": gpu, "host": host, "values": values, "index": index, "mode": mode.value}
