"""HBM_ONLY rows: every value row sits in ``storage.values`` on the table's device."""

from __future__ import annotations

import torch

from hashrec.table.ops.optimizer import apply_sparse_update
from hashrec.table.optim import OptimizerSpec
from hashrec.table.storage import TableStorage


class DeviceRows:
    """Value rows kept in the index storage's own ``values`` tensor (rehash moves them).

    Every row store offers the same methods; ``slots`` are unique logical slots >= 0,
    except in ``update``, which skips negative slots (keys without a stored row).
    """

    keeps_values_in_index = True

    def __init__(self, storage: TableStorage) -> None:
        self.storage = storage

    def read(self, slots: torch.Tensor, start: int, width: int, admit: bool) -> torch.Tensor:
        """Rows (n, width) of columns [start, start + width) of ``slots`` (n,)."""
        values = self.storage.values
        if start == 0 and width == values.shape[1]:
            return values.index_select(0, slots)  # whole rows: no column slicing
        return values[slots, start:start + width]

    def write(self, slots: torch.Tensor, rows: torch.Tensor, start: int, admit: bool) -> None:
        """Writes rows (n, w) into columns [start, start + w) of ``slots`` (n,)."""
        values = self.storage.values
        if start == 0 and rows.shape[1] == values.shape[1]:
            values.index_copy_(0, slots, rows.to(values.dtype))  # whole rows
            return
        values[slots, start:start + rows.shape[1]] = rows.to(values.dtype)

    def update(self, slots: torch.Tensor, grads: torch.Tensor, spec: OptimizerSpec, lr: float,
               step: int) -> None:
        """In-place optimizer step of rows ``slots`` (u,) with grads (u, dim)."""
        apply_sparse_update(self.storage.values, slots, grads, spec, lr, step)

    def regrow(self, old: TableStorage, new: TableStorage) -> None:
        """Follows a rehash (the rehash op already moved the rows)."""
        self.storage = new

    def begin_batch(self) -> None:
        """Marks the start of a lookup (nothing to do without a cache)."""

    def prefetch(self, slots: torch.Tensor) -> None:
        """Nothing to prefetch: every row is on the device."""

    def flush(self) -> None:
        """Nothing to write back."""

    @property
    def host_access(self) -> str:
        return "none"

    def tier_tensors(self) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        """(device-tier, host-tier) tensors beyond the index (values count with the index)."""
        return [], []

    def stats(self) -> dict[str, int | float | str]:
        return {}
