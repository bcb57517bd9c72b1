"""Counters the trainer logs: per logical table and per storage.

A storage's counters (inserts, evictions, refusals, admission rejections, hits)
come from its table and are shared by the logical tables fused into it. Per
logical table the collection counts what it asked for: forwards that read the
table (``lookups``), ids (with duplicates), unique ids, and unique ids served
from a stored row (``stored``: hits plus keys inserted by that lookup; keys
awaiting admission, refused, or missing in eval are not stored). ``size`` per
logical table counts the entries carrying its tag.
"""

from __future__ import annotations

import torch


class TableCounters:
    """Running counts of one logical table; device-side sums avoid a sync per step."""

    def __init__(self) -> None:
        self.lookups = 0
        self.ids = 0
        self.unique_ids = 0
        self._stored: torch.Tensor | None = None

    def record(self, ids: int, slots: torch.Tensor) -> None:
        """Adds one lookup of ``ids`` ids whose unique keys got ``slots`` (-1 = not stored)."""
        self.lookups += 1
        self.ids += ids
        self.unique_ids += slots.numel()
        stored = (slots >= 0).sum()
        self._stored = stored if self._stored is None else self._stored + stored

    @property
    def stored(self) -> int:
        return 0 if self._stored is None else int(self._stored)


def _per_tag_sizes(storage) -> list[int]:
    tables = storage.plan.tables
    if not storage.plan.is_dynamic:
        return [storage.table.num_rows]
    if not storage.plan.fused:
        return [storage.table.size()]
    index = storage.table.storage
    tags = index.tags[index.digests != 0].to(torch.int64)
    return torch.bincount(tags, minlength=len(tables)).tolist()


def table_stats(counters: TableCounters, storage, tag: int, size: int) -> dict[str, float]:
    """One logical table's counters: storage, tag, size, lookups, ids, unique_ids, stored,
    stored_rate."""
    unique = counters.unique_ids
    return {
        "storage": storage.name, "tag": tag, "size": size, "lookups": counters.lookups,
        "ids": counters.ids, "unique_ids": unique, "stored": counters.stored,
        "stored_rate": counters.stored / unique if unique else 0.0,
    }


def storage_stats(storage) -> dict[str, float]:
    """One storage's counters: the table's own (dynamic) plus load_factor and hit_rate."""
    out = dict(storage.table.stats())
    if storage.plan.is_dynamic:
        out["load_factor"] = storage.table.load_factor()
        out["hit_rate"] = out["hits"] / out["lookups"] if out.get("lookups") else 0.0
    out["tables"] = [spec.name for spec in storage.plan.tables]
    out["memory_bytes"] = storage.table.memory_bytes()
    return out


def collection_stats(storages) -> dict[str, dict[str, dict]]:
    """{"tables": {table: table_stats}, "storages": {storage: storage_stats}}; counters per
    logical table are read from ``storage.counters``."""
    tables, storages_out = {}, {}
    for storage in storages:
        sizes = _per_tag_sizes(storage)
        for tag, spec in enumerate(storage.plan.tables):
            tables[spec.name] = table_stats(storage.counters[tag], storage, tag, sizes[tag])
        storages_out[storage.name] = storage_stats(storage)
    return {"tables": tables, "storages": storages_out}
