"""Upserts with their rows: insert_or_assign and find_or_insert on CUDA, no host sync.

``upsert_assign`` stores a batch's rows at its keys; ``upsert_embeddings`` returns its
embeddings, new rows initialized. Each is ``upsert_slots`` and a row kernel, but the
present keys' slots are known as soon as the upsert's probe kernel has run, so their
rows move beside the rest of the upsert (``upsert_slots(beside=...)``): the row kernel,
bandwidth-bound, runs on the caller's stream while the misses are placed on a stream of
the highest priority (their kernels are latency-bound and leave most of the memory
bandwidth idle); a second row kernel then serves the new keys. At dim 128 the rows of
1M keys are 0.5 GB to read and 0.5 GB to write, about as long as placing the misses.

The row kernel beside the insert reads each key's slot while the upsert may be writing
it, and sees either the probe's value or the final one; the outcome is the same:

* a present key that keeps its slot: its row is stored (read) there;
* a present key that a miss of the same call evicts: its row is stored into the slot
  the miss now holds, and the miss's row overwrites it after the join (find_or_insert:
  the key's embedding read beside is replaced by its initial one, as without overlap);
* a new key whose final slot is already written: the same row is stored (read) again
  after the join.

``UPSERT_ROWS["beside"]`` (``HASHREC_UPSERT_BESIDE``, default 1) turns the overlap off:
0 runs the upsert and then one row kernel over every key. ``UPSERT_ROWS["per_sm"]``
(``HASHREC_UPSERT_ROWS_PER_SM``): the row kernel beside the insert runs that many
programs a multiprocessor, each looping over tiles of rows (0: one program a tile), to
leave the insert room on the device.
"""

from __future__ import annotations

import torch

from hashrec.table.ops.insert.rows import (
    ALL_ROWS,
    FRESH_ROWS,
    STORED_ROWS,
    read_or_init_rows,
    write_rows,
)
from hashrec.table.ops.insert.upsert import UpsertResult, multiprocessors, upsert_slots
from hashrec.table.ops.launch import env_int
from hashrec.table.storage import TableStorage

__all__ = ["UPSERT_ROWS", "upsert_assign", "upsert_embeddings"]

UPSERT_ROWS = {"beside": env_int("HASHREC_UPSERT_BESIDE", 1),
               "per_sm": env_int("HASHREC_UPSERT_ROWS_PER_SM", 0)}


def _programs(device: torch.device) -> int | None:
    """Programs of the row kernel beside the insert (None: one a tile)."""
    per_sm = UPSERT_ROWS["per_sm"]
    return per_sm * multiprocessors(device) if per_sm > 0 else None


def upsert_assign(storage: TableStorage, keys: torch.Tensor, tags: torch.Tensor | None,
                  scores: torch.Tensor, rows: torch.Tensor, allow_evict: bool) -> UpsertResult:
    """Upserts keys (n,) int64 [+ tags] with ``scores`` (n,) and stores ``rows`` (n,
    row_dim) at every placed key (of a key repeated in the batch, one of its rows lands).
    Returns ``upsert_slots``'s result; no host sync."""
    values = storage.values
    if rows.shape != (keys.numel(), values.shape[1]):
        raise ValueError(f"rows must be ({keys.numel()}, {values.shape[1]}), got "
                         f"{tuple(rows.shape)}")
    rows = rows.to(values.dtype).contiguous()
    if not UPSERT_ROWS["beside"]:
        result = upsert_slots(storage, keys, tags, scores, allow_evict)
        write_rows(values, result.slots, None, rows)
        return result
    result = upsert_slots(storage, keys, tags, scores, allow_evict,
                          beside=lambda slots: write_rows(values, slots, None, rows,
                                                          _programs(slots.device)))
    write_rows(values, result.slots, result.created, rows)
    return result


def upsert_embeddings(storage: TableStorage, keys: torch.Tensor, tags: torch.Tensor | None,
                      scores: torch.Tensor, allow_evict: bool, dim: int, lower: float,
                      upper: float, seed: int, state: float = 0.0
                      ) -> tuple[UpsertResult, torch.Tensor]:
    """Upserts keys (n,) int64 [+ tags] with ``scores`` (n,) and returns (the upsert's
    result, embeddings (n, dim) float32): a present key's stored row, a new or refused
    key's initial one (``read_or_init_rows``: uniform in [lower, upper) from ``seed``,
    columns past ``dim`` of new rows set to ``state``). No host sync."""
    n, row_dim = keys.numel(), storage.values.shape[1]
    if not 0 < dim <= row_dim:
        raise ValueError(f"dim={dim} must be in [1, row_dim={row_dim}]")
    out = torch.empty(n, dim, dtype=torch.float32, device=keys.device)
    init = (dim, lower, upper, seed, state)

    keys = keys.contiguous()
    tags = tags.contiguous() if tags is not None else None

    def rows(slots: torch.Tensor, result: UpsertResult | None, part: int) -> None:
        read_or_init_rows(storage.values, keys, tags, slots,
                          result.created if result is not None else None,
                          result.inserted if result is not None else None, *init,
                          out=out, part=part,
                          programs=_programs(slots.device) if part == STORED_ROWS else None)

    if not UPSERT_ROWS["beside"]:
        result = upsert_slots(storage, keys, tags, scores, allow_evict)
        rows(result.slots, result, ALL_ROWS)
        return result, out
    result = upsert_slots(storage, keys, tags, scores, allow_evict,
                          beside=lambda slots: rows(slots, None, STORED_ROWS))
    rows(result.slots, result, FRESH_ROWS)
    return result, out
