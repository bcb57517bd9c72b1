"""HYBRID rows: buckets [0, k) in device memory, buckets [k, num_buckets) in pinned host
memory, with k / num_buckets ~= cache_load_factor.

A slot's row lives on the device when ``slot < k * bucket_capacity``; kernels reach
host rows in place (see ``two_part``). A rehash re-splits the grown bucket range by
the same factor and moves every row to its new slot.
"""

from __future__ import annotations

import torch

from hashrec.table.optim import OptimizerSpec
from hashrec.table.options import TableOptions
from hashrec.table.storage import TableStorage
from hashrec.table.tiers.moves import move_rows, rehash_moves, stored_only
from hashrec.table.tiers.two_part import TwoPartRows, allocate_host


def device_buckets(num_buckets: int, cache_load_factor: float) -> int:
    """Buckets kept in device memory: round(cache_load_factor * num_buckets), in [0, n]."""
    return min(num_buckets, max(0, round(cache_load_factor * num_buckets)))


class HybridRows:
    """Value rows split by bucket between device and pinned host memory.

    Args:
        options: the table's options (row_dim, dtype, device, cache_load_factor).
        num_buckets: buckets of the index now.
    """

    keeps_values_in_index = False

    def __init__(self, options: TableOptions, num_buckets: int) -> None:
        self.options = options
        self.rows = self._allocate(num_buckets)

    def _allocate(self, num_buckets: int) -> TwoPartRows:
        opts = self.options
        split = device_buckets(num_buckets, opts.cache_load_factor) * opts.bucket_capacity
        self.capacity = num_buckets * opts.bucket_capacity
        host_rows = self.capacity - split
        first = torch.zeros(max(split, 1), opts.row_dim, dtype=opts.dtype, device=opts.device)
        second = allocate_host(host_rows, opts.row_dim, opts.dtype, opts.device)
        return TwoPartRows(first, second, split, opts.device)

    @property
    def split(self) -> int:
        """Slots [0, split) are in device memory."""
        return self.rows.split

    @property
    def host_access(self) -> str:
        return self.rows.mode

    def read(self, slots: torch.Tensor, start: int, width: int, admit: bool) -> torch.Tensor:
        return self.rows.gather(slots, start, width)

    def write(self, slots: torch.Tensor, rows: torch.Tensor, start: int, admit: bool) -> None:
        self.rows.scatter(slots, rows, start)

    def update(self, slots: torch.Tensor, grads: torch.Tensor, spec: OptimizerSpec, lr: float,
               step: int) -> None:
        slots, grads = stored_only(slots, grads)
        self.rows.update(slots, grads, spec, lr, step)

    def regrow(self, old: TableStorage, new: TableStorage) -> None:
        """Moves every row to its slot in the grown index, split anew."""
        before, after = rehash_moves(old, new)
        grown = self._allocate(new.num_buckets)
        move_rows(self.rows.gather, grown.scatter, before, after)
        self.rows = grown

    def begin_batch(self) -> None:
        """Nothing to do: placement is fixed by bucket."""

    def prefetch(self, slots: torch.Tensor) -> None:
        """Nothing to prefetch: host rows are read in place."""

    def flush(self) -> None:
        """Nothing to write back: every row has one home."""

    def tier_tensors(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """(device-tier tensors, host-tier tensors)."""
        return [self.rows.first], [self.rows.second]

    def stats(self) -> dict[str, int]:
        return {"device_rows": self.split, "host_rows": self.capacity - self.split}
