"""Storage tiers: where a dynamic table's value rows live (DynamicEmb's storage modes).

The index (keys, tags, digests, scores) always sits on the table's device; a row
store holds the value rows ``[embedding | optimizer state]`` by logical slot:

* HBM_ONLY (``DeviceRows``): in the index storage's ``values`` on the device.
* HYBRID (``HybridRows``): buckets [0, k) on the device, the rest in pinned host
  memory, k / num_buckets ~= cache_load_factor.
* CACHING (``CachedRows``): every row in pinned host memory plus a device cache of
  cache_load_factor of the rows.

Placement is the only difference: the index decides admission, eviction and
growth identically in every mode, so lookups, updates and exports agree. Every
store offers ``read``, ``write``, ``update``, ``regrow``, ``begin_batch``,
``prefetch``, ``flush``, ``tier_tensors``, ``stats`` and ``host_access``.
"""

from __future__ import annotations

from hashrec.table.options import StorageMode, TableOptions
from hashrec.table.storage import TableStorage
from hashrec.table.tiers.caching import CachedRows
from hashrec.table.tiers.device_rows import DeviceRows
from hashrec.table.tiers.hybrid import HybridRows

RowStore = DeviceRows | HybridRows | CachedRows


def index_row_dim(options: TableOptions) -> int:
    """Width of the index storage's ``values``: row_dim for HBM_ONLY, else 0 (the rows
    live in the row store)."""
    return options.row_dim if options.storage_mode is StorageMode.HBM_ONLY else 0


def make_row_store(options: TableOptions, storage: TableStorage) -> RowStore:
    """The row store of ``options.storage_mode`` for an index ``storage``."""
    mode = options.storage_mode
    if mode is StorageMode.HBM_ONLY:
        return DeviceRows(storage)
    if mode is StorageMode.HYBRID:
        return HybridRows(options, storage.num_buckets)
    return CachedRows(options, storage.capacity)


__all__ = ["CachedRows", "DeviceRows", "HybridRows", "RowStore", "index_row_dim",
           "make_row_store"]
