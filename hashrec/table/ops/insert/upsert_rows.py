"""Upserts with their rows: insert_or_assign and find_or_insert on CUDA, no host sync.

``upsert_assign`` stores a batch's rows at its keys; ``upsert_embeddings`` returns its
embeddings, new rows initialized. Each is ``upsert_slots`` and then one row kernel over
every key (``write_rows``, ``read_or_init_rows``).

Writing the present keys' rows beside the insert of the misses (their slots are known
once the probe ran), on another stream, was slower at every setting tried on an H200:
the row kernel holds the memory system and the insert's scattered, dependent accesses
stall behind it (benchmarks/results/upsert_rows_beside.md).
"""

from __future__ import annotations

import torch

from hashrec.table.ops.insert.rows import read_or_init_rows, write_rows
from hashrec.table.ops.insert.upsert import UpsertResult, upsert_slots
from hashrec.table.storage import TableStorage

__all__ = ["upsert_assign", "upsert_embeddings"]


def upsert_assign(storage: TableStorage, keys: torch.Tensor, tags: torch.Tensor | None,
                  scores: torch.Tensor, rows: torch.Tensor, allow_evict: bool) -> UpsertResult:
    """Upserts keys (n,) int64 [+ tags] with ``scores`` (n,) and stores ``rows`` (n,
    row_dim) at every placed key (of a key repeated in the batch, one of its rows lands).
    Returns ``upsert_slots``'s result; no host sync."""
    values = storage.values
    if rows.shape != (keys.numel(), values.shape[1]):
        raise ValueError(f"rows must be ({keys.numel()}, {values.shape[1]}), got "
                         f"{tuple(rows.shape)}")
    result = upsert_slots(storage, keys, tags, scores, allow_evict)
    write_rows(values, result.slots, None, rows)
    return result


def upsert_embeddings(storage: TableStorage, keys: torch.Tensor, tags: torch.Tensor | None,
                      scores: torch.Tensor, allow_evict: bool, dim: int, lower: float,
                      upper: float, seed: int, state: float = 0.0
                      ) -> tuple[UpsertResult, torch.Tensor]:
    """Upserts keys (n,) int64 [+ tags] with ``scores`` (n,) and returns (the upsert's
    result, embeddings (n, dim) float32): a present key's stored row, a new or refused
    key's initial one (``read_or_init_rows``: uniform in [lower, upper) from ``seed``,
    columns past ``dim`` of new rows set to ``state``). No host sync."""
    result = upsert_slots(storage, keys, tags, scores, allow_evict)
    out = read_or_init_rows(storage.values, keys.contiguous(),
                            tags.contiguous() if tags is not None else None, result.slots,
                            result.created, result.inserted, dim, lower, upper, seed, state)
    return result, out
