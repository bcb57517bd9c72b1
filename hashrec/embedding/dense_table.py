"""Dense embedding table: a fixed row matrix updated by the sparse optimizer.

A dense table (``num_buckets``, ``hash_bucket_size``, vocab or boundaries
features) stores its rows in one registered buffer ``rows`` of shape
(num_rows, dim + state_dim): the embedding followed by the optimizer state, the
same row layout as a dynamic table, in the table's dtype (float32, or float16 /
bfloat16 for a feature's ``data_type``: lookups return float32, updates compute in
float32 and store rounded). Being a buffer, it travels in the model's
``state_dict`` together with its optimizer state, and the dense optimizer never
sees it: backward updates it in place with
``hashrec.table.ops.optimizer.apply_sparse_update``, exactly like dynamic rows.

Initialization follows TorchRec's default for embedding tables, which
TorchEasyRec inherits: uniform in +-sqrt(1 / num_rows) (``InitializerArgs()``
resolved against ``num_rows``); an explicit ``InitializerArgs`` may choose
NORMAL, TRUNCATED_NORMAL, UNIFORM or CONSTANT instead.
"""

from __future__ import annotations

from typing import NamedTuple

import torch
from torch import nn

from hashrec.table.initializers import initial_values
from hashrec.table.ops.optimizer import apply_sparse_update
from hashrec.table.optim import OptimizerSpec
from hashrec.table.options import ROW_DTYPES, InitializerArgs


class DenseLookup(NamedTuple):
    """Result of ``DenseTable.lookup``: slots (u,) int64 (the ids) and values (u, dim) float32
    (whatever the rows' dtype)."""

    slots: torch.Tensor
    values: torch.Tensor


def update_dense_rows(rows: torch.Tensor, slots: torch.Tensor, grads: torch.Tensor,
                      optimizer: OptimizerSpec, lr: float | None, step: int) -> None:
    """Sparse optimizer step on ``rows`` at unique ``slots`` (u,) with grads (u, dim).

    ``lr`` overrides the spec's rate; ``step`` is the table's step (Adam uses at least 1).
    """
    if slots.numel() == 0:
        return
    rate = optimizer.lr if lr is None else lr
    apply_sparse_update(rows, slots, grads.float(), optimizer, rate, max(step, 1))


class DenseTable(nn.Module):
    """Rows known in advance; ids index rows directly.

    Args:
        name: table name (error messages).
        num_rows: rows of the table; ids must lie in [0, num_rows).
        dim: embedding dimension.
        optimizer: sparse optimizer spec; decides the state columns.
        initializer: None -> uniform +-sqrt(1 / num_rows) (TorchRec's default).
        device: where ``rows`` lives.
        dtype: dtype of ``rows`` (embedding and optimizer state): float32, float16,
            bfloat16 or float64.

    Attributes:
        keys_may_be_negative: True (the default) when lookups may carry negative
            keys (ids without a ZCH slot); False when the caller guarantees ids in
            [0, num_rows), which spares the lookup a device read.
    """

    def __init__(self, name: str, num_rows: int, dim: int, optimizer: OptimizerSpec,
                 initializer: InitializerArgs | None = None,
                 device: torch.device | str | None = None,
                 dtype: torch.dtype = torch.float32) -> None:
        super().__init__()
        if dtype not in ROW_DTYPES:
            raise ValueError(f"dense table {name!r}: dtype={dtype!r} is not valid; allowed: "
                             f"{', '.join(str(d) for d in ROW_DTYPES)}")
        self.name, self.num_rows, self.dim, self.optimizer = name, num_rows, dim, optimizer
        self.keys_may_be_negative = True
        state_dim = optimizer.state_dim(dim)
        rows = torch.empty(num_rows, dim + state_dim, dtype=dtype, device=device)
        self._init_args = (initializer or InitializerArgs()).resolved(dim, num_rows)
        self.register_buffer("rows", rows)
        self.reset_rows(torch.arange(num_rows, dtype=torch.int64, device=device))
        # The step of Adam's bias correction; a buffer so that checkpoints carry it.
        self.register_buffer("step_count", torch.zeros((), dtype=torch.int64, device=device))
        self._step = 0

    @property
    def step(self) -> int:
        """Training steps taken (advanced once per training forward)."""
        return self._step

    @property
    def device(self) -> torch.device:
        return self.rows.device

    @property
    def row_dim(self) -> int:
        return self.rows.shape[1]

    def advance_step(self) -> None:
        """Advances the step clock by one (the collection calls it once per training forward)."""
        self._step += 1  # step_count (the buffer checkpoints carry) follows when saved

    def _save_to_state_dict(self, destination, prefix, keep_vars) -> None:
        self.step_count.fill_(self._step)
        super()._save_to_state_dict(destination, prefix, keep_vars)
        rows = self.rows
        if not keep_vars and rows.untyped_storage().nbytes() != rows.numel() * rows.element_size():
            # rows is a view into a DenseGroup's matrix: save this table's block only.
            destination[prefix + "rows"] = rows.detach().clone()

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs) -> None:
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        self._step = int(self.step_count)

    def reset_rows(self, slots: torch.Tensor) -> None:
        """Re-initializes rows ``slots`` (k,) int64: initial embedding and optimizer state."""
        if slots.numel() == 0:
            return
        state_dim = self.rows.shape[1] - self.dim
        self.rows[slots, :self.dim] = initial_values(self._init_args, slots, None, self.dim,
                                                     torch.float32).to(self.rows.dtype)
        if state_dim:
            self.rows[slots, self.dim:] = self.optimizer.initial_state(self.dim).to(
                self.rows.device, self.rows.dtype)

    def lookup(self, keys: torch.Tensor, tags: torch.Tensor | None = None,
               train: bool = False, counts: torch.Tensor | None = None) -> DenseLookup:
        """keys (u,) int64 ids in [0, num_rows) -> DenseLookup(slots=keys, values (u, dim)).

        A negative key (an id a zero-collision remapper has no slot for) reads as
        zeros; its slot stays negative, so it gets no update. ``tags``, ``train`` and
        ``counts`` are accepted for symmetry with ``HashTable.lookup``; a dense table
        has no namespaces, never inserts and has no admission. The caller validates ids.
        """
        if self.keys_may_be_negative and keys.numel() and bool((keys < 0).any()):
            values = self.rows.index_select(0, keys.clamp(min=0))[:, :self.dim].float()
            return DenseLookup(keys, values.masked_fill((keys < 0).unsqueeze(1), 0.0))
        return DenseLookup(keys, self.rows.index_select(0, keys)[:, :self.dim].float())

    def apply_gradients(self, slots: torch.Tensor, grads: torch.Tensor,
                        lr: float | None = None) -> None:
        """In-place optimizer update of rows ``slots`` (u,) unique with grads (u, dim)."""
        update_dense_rows(self.rows, slots, grads, self.optimizer, lr, self._step)

    def memory_bytes(self) -> dict[str, int]:
        """Bytes of ``rows``: {"gpu": ..., "host": ...}."""
        size = self.rows.numel() * self.rows.element_size()
        on_gpu = self.rows.device.type == "cuda"
        return {"gpu": size if on_gpu else 0, "host": 0 if on_gpu else size}

    def stats(self) -> dict[str, float]:
        """Size counters in the shape of a dynamic table's (a dense table is always full)."""
        return {"size": self.num_rows, "capacity": self.num_rows, "load_factor": 1.0}

    def extra_repr(self) -> str:
        return (f"name={self.name!r}, num_rows={self.num_rows}, dim={self.dim}, "
                f"dtype={self.rows.dtype}")
