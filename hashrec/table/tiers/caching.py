"""CACHING rows: host memory holds every row; a device cache holds the hot ones.

The logical table (the index, its scores, admission and eviction) is the same as
in HBM_ONLY; only where a row's bytes sit differs. Host rows are addressed by
logical slot. The cache has ``ceil(cache_load_factor * capacity)`` rows, each
owned by one logical slot (``owner``; ``slot_of`` maps back), with a dirty bit
and the batch clock of its last use:

* a lookup's rows are admitted: hits are stamped, misses are fetched from host
  into the least recently used cache rows not used by this batch (dirty victims
  are written back first); rows that find no free cache row are read and written
  on host in place;
* writes of whole new rows take a cache row without fetching; writes and
  optimizer updates of cached rows mark them dirty;
* export reads cached rows from the cache and the rest from host, so a
  checkpoint equals HBM_ONLY's without a flush; a rehash flushes, moves the host
  rows and empties the cache.
"""

from __future__ import annotations

import math
from collections import Counter

import torch

from hashrec.table.optim import OptimizerSpec
from hashrec.table.options import TableOptions
from hashrec.table.storage import TableStorage
from hashrec.table.tiers.moves import move_rows, rehash_moves, stored_only
from hashrec.table.tiers.two_part import TwoPartRows, allocate_host
from hashrec.table.validation import concrete_device

_NEVER = torch.iinfo(torch.int64).max


def cache_rows(capacity: int, cache_load_factor: float) -> int:
    """Rows of the device cache for ``capacity`` logical slots (at least one)."""
    return max(1, math.ceil(cache_load_factor * capacity))


class CachedRows:
    """Full host copy of the value rows plus a device cache of hot rows.

    Args:
        options: the table's options (row_dim, dtype, device, cache_load_factor).
        capacity: logical slots of the index now.
    """

    keeps_values_in_index = False

    def __init__(self, options: TableOptions, capacity: int) -> None:
        self.options = options
        self._clock = 0
        self._counts: Counter[str] = Counter()
        self._allocate(capacity)

    def _allocate(self, capacity: int) -> None:
        opts, device = self.options, concrete_device(self.options.device)
        self.capacity = capacity
        self.cache_rows = cache_rows(capacity, opts.cache_load_factor)
        cache = torch.zeros(self.cache_rows, opts.row_dim, dtype=opts.dtype, device=device)
        host = allocate_host(capacity, opts.row_dim, opts.dtype, device)
        self.rows = TwoPartRows(cache, host, self.cache_rows, device)
        self.slot_of = torch.full((capacity,), -1, dtype=torch.int64, device=device)
        self.owner = torch.full((self.cache_rows,), -1, dtype=torch.int64, device=device)
        self.dirty = torch.zeros(self.cache_rows, dtype=torch.bool, device=device)
        self.last_use = torch.full((self.cache_rows,), -1, dtype=torch.int64, device=device)

    @property
    def host_access(self) -> str:
        return self.rows.mode

    # -------------------------------------------------------------- placement
    def _locate(self, slots: torch.Tensor) -> torch.Tensor:
        """Two-part index of ``slots``: the cache row, or cache_rows + slot on host."""
        cached = self.slot_of[slots]
        return torch.where(cached >= 0, cached, slots + self.cache_rows)

    def _admit(self, slots: torch.Tensor, fetch: bool, stamp: int,
               count: bool = False) -> torch.Tensor:
        """Brings unique ``slots`` into the cache where rows are free; returns their index.

        Cache rows stamped with the current clock (this batch) are never victims.
        """
        cached = self.slot_of[slots]
        hit = cached >= 0
        self.last_use[cached[hit]] = torch.clamp(self.last_use[cached[hit]], min=stamp)
        miss = torch.nonzero(~hit).flatten()
        if count:
            self._counts["cache_lookups"] += slots.numel()
            self._counts["cache_hits"] += slots.numel() - miss.numel()
        if miss.numel():
            victims = self._victims(miss.numel())
            take = miss[:victims.numel()]
            if victims.numel():
                self._evict(victims)
                self._fill(victims, slots[take], fetch, stamp)
                cached[take] = victims
            self._counts["host_direct_rows"] += miss.numel() - victims.numel()
        return torch.where(cached >= 0, cached, slots + self.cache_rows)

    def _victims(self, wanted: int) -> torch.Tensor:
        """Up to ``wanted`` cache rows, empty ones first, then least recently used."""
        free = self.last_use < self._clock
        count = min(wanted, int(free.sum()))
        if count == 0:
            return torch.empty(0, dtype=torch.int64, device=self.owner.device)
        age = torch.where(free, self.last_use, _NEVER)
        return torch.sort(age, stable=True).indices[:count]

    def _evict(self, victims: torch.Tensor) -> None:
        owners = self.owner[victims]
        held = owners >= 0
        back = victims[held & self.dirty[victims]]
        if back.numel():
            self.rows.copy(back, self.owner[back] + self.cache_rows)
            self._counts["written_back_rows"] += back.numel()
        self.slot_of[owners[held]] = -1

    def _fill(self, victims: torch.Tensor, slots: torch.Tensor, fetch: bool, stamp: int) -> None:
        if fetch:
            self.rows.copy(slots + self.cache_rows, victims)
            self._counts["fetched_rows"] += victims.numel()
        self.owner[victims] = slots
        self.slot_of[slots] = victims
        self.dirty[victims] = False
        self.last_use[victims] = stamp

    def _mark_dirty(self, index: torch.Tensor) -> None:
        self.dirty[index[index < self.cache_rows]] = True

    # ------------------------------------------------------------ row access
    def read(self, slots: torch.Tensor, start: int, width: int, admit: bool) -> torch.Tensor:
        """Rows of ``slots``; ``admit`` (lookups) caches misses, else reads in place."""
        if admit:
            index = self._admit(slots, True, self._clock, count=True)
        else:
            index = self._locate(slots)
        return self.rows.gather(index, start, width)

    def write(self, slots: torch.Tensor, rows: torch.Tensor, start: int, admit: bool) -> None:
        """Writes columns [start, start + w); whole rows are cached without a fetch."""
        whole = start == 0 and rows.shape[1] == self.options.row_dim
        if admit:
            index = self._admit(slots, not whole, self._clock)
        else:
            index = self._locate(slots)
        self.rows.scatter(index, rows, start)
        self._mark_dirty(index)

    def update(self, slots: torch.Tensor, grads: torch.Tensor, spec: OptimizerSpec, lr: float,
               step: int) -> None:
        """Optimizer step where each row is now (cache: marked dirty; else host)."""
        slots, grads = stored_only(slots, grads)
        index = self._locate(slots)
        self.rows.update(index, grads, spec, lr, step)
        self._mark_dirty(index)

    # ------------------------------------------------------------- lifecycle
    def regrow(self, old: TableStorage, new: TableStorage) -> None:
        """Writes the cache back, moves host rows to their new slots, empties the cache."""
        self.flush()
        before, after = rehash_moves(old, new)
        rows, offset = self.rows, self.cache_rows
        self._allocate(new.capacity)
        move_rows(lambda s: rows.gather(s + offset),
                  lambda s, r: self.rows.scatter(s + self.cache_rows, r), before, after)

    def begin_batch(self) -> None:
        """Starts a lookup: rows it uses are kept in the cache until the next one."""
        self._clock += 1

    def prefetch(self, slots: torch.Tensor) -> None:
        """Caches rows of unique ``slots`` for the next lookup (kept through it)."""
        before = self._counts["fetched_rows"]
        self._admit(slots, True, self._clock + 1)
        self._counts["prefetched_rows"] += self._counts["fetched_rows"] - before

    def flush(self) -> None:
        """Writes every dirty cache row back to host (the cache stays valid)."""
        back = torch.nonzero(self.dirty & (self.owner >= 0)).flatten()
        if back.numel():
            self.rows.copy(back, self.owner[back] + self.cache_rows)
            self._counts["written_back_rows"] += back.numel()
        self.dirty.zero_()

    def tier_tensors(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """(device-tier tensors: cache rows and bookkeeping, host-tier tensors: all rows)."""
        return ([self.rows.first, self.slot_of, self.owner, self.dirty, self.last_use],
                [self.rows.second])

    def stats(self) -> dict[str, int | float]:
        """cache_rows, cache_lookups, cache_hits, cache_hit_rate, fetched_rows,
        prefetched_rows, written_back_rows, host_direct_rows (rows served on host because
        the batch filled the cache)."""
        names = ("cache_lookups", "cache_hits", "fetched_rows", "prefetched_rows",
                 "written_back_rows", "host_direct_rows")
        out: dict[str, int | float] = {name: int(self._counts[name]) for name in names}
        out["cache_rows"] = self.cache_rows
        lookups = out["cache_lookups"]
        out["cache_hit_rate"] = out["cache_hits"] / lookups if lookups else 0.0
        return out
