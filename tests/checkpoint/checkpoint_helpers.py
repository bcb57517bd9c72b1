"""Shared helpers for checkpoint tests: trained tables and exact snapshots of them."""

from __future__ import annotations

import torch

from hashrec.table import (
    AdmissionOptions,
    HashTable,
    InitializerArgs,
    SparseAdagrad,
    SparseAdam,
    TableOptions,
)
from hashrec.table.hashing import owner_of

DIM = 4


def table_options(optimizer=None, dim: int = DIM, admission: bool = True,
                  max_capacity: int = 4096, dtype=torch.float32) -> TableOptions:
    """Options of the tables under test: per-key deterministic init, admission at 2."""
    return TableOptions(
        dim=dim, max_capacity=max_capacity, bucket_capacity=16,
        initializer=InitializerArgs(mode="NORMAL", key_seed=7),
        admission=AdmissionOptions(threshold=2) if admission else None,
        optimizer=SparseAdagrad(lr=0.1) if optimizer is None else optimizer,
        dtype=dtype, name="t")


def adam_options(**kwargs) -> TableOptions:
    return table_options(optimizer=SparseAdam(lr=0.05), **kwargs)


def batch_keys(step: int, seed: int, n: int = 64, key_range: int = 400) -> torch.Tensor:
    """Unique keys of one training step, negatives included."""
    gen = torch.Generator().manual_seed(seed * 100_003 + step)
    keys = torch.randint(-key_range, key_range, (n,), generator=gen, dtype=torch.int64)
    return torch.unique(keys)


def gradients(keys: torch.Tensor, step: int, dim: int) -> torch.Tensor:
    """A deterministic gradient per (key, step), independent of batch order."""
    cols = torch.arange(dim, dtype=torch.float64)
    phase = keys.to(torch.float64)[:, None] * 0.37 + step * 1.3 + cols
    return torch.sin(phase).to(torch.float32)


def train_steps(table: HashTable, first: int, last: int, seed: int = 0,
                rank: int = 0, world_size: int = 1, tagged: bool = False) -> None:
    """Runs steps ``first..last``: lookup, update, advance; keeps only owned keys.

    ``tagged`` spreads keys over three namespaces (tags 0..2), as in table fusion.
    """
    for step in range(first, last + 1):
        keys = batch_keys(step, seed)
        keys = keys[owner_of(keys, world_size) == rank]
        tags = (keys.abs() % 3).to(torch.int32) if tagged else None
        table.advance_step()
        result = table.lookup(keys, tags, train=True)
        stored = result.slots >= 0
        if bool(stored.any()):
            table.apply_gradients(result.slots[stored],
                                  gradients(keys[stored], step, table.dim))


def trained_table(steps: int = 8, seed: int = 0, rank: int = 0, world_size: int = 1,
                  options: TableOptions | None = None, tagged: bool = False) -> HashTable:
    table = HashTable(options or table_options())
    train_steps(table, 1, steps, seed, rank, world_size, tagged)
    return table


def _sort_by_identity(keys: torch.Tensor, tags: torch.Tensor) -> torch.Tensor:
    order = torch.argsort(keys, stable=True)
    return order[torch.argsort(tags[order], stable=True)]


def snapshot(table: HashTable) -> dict[str, torch.Tensor]:
    """Every entry (keys, tags, rows, scores) and admission counter, in a canonical order."""
    parts = list(table.export_state(1000))
    if parts:
        keys, tags, rows, scores = (torch.cat([p[i] for p in parts]) for i in range(4))
    else:
        keys = torch.zeros(0, dtype=torch.int64)
        tags = torch.zeros(0, dtype=torch.int32)
        rows = torch.zeros(0, table.row_dim, dtype=table.options.dtype)
        scores = torch.zeros(0, dtype=torch.int64)
    order = _sort_by_identity(keys, tags)
    ckeys, ctags, counts = table.admission_state()
    corder = _sort_by_identity(ckeys, ctags)
    return {"keys": keys[order], "tags": tags[order], "rows": rows[order],
            "scores": scores[order], "counter_keys": ckeys[corder],
            "counter_tags": ctags[corder], "counts": counts[corder]}


def merge_snapshots(snaps: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Snapshots of disjoint shards -> one snapshot in canonical order."""
    merged = {name: torch.cat([s[name] for s in snaps]) for name in snaps[0]}
    order = _sort_by_identity(merged["keys"], merged["tags"])
    corder = _sort_by_identity(merged["counter_keys"], merged["counter_tags"])
    out = {name: merged[name][order] for name in ("keys", "tags", "rows", "scores")}
    out.update({name: merged[name][corder] for name in ("counter_keys", "counter_tags",
                                                        "counts")})
    return out


def assert_same(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor]) -> None:
    for name in expected:
        assert actual[name].shape == expected[name].shape, name
        assert torch.equal(actual[name], expected[name]), name
