"""Counters the trainer logs: per logical table and per storage.

A storage's counters (inserts, evictions, refusals, admission rejections, hits)
come from its table and are shared by the logical tables fused into it, but for
admission rejections and refused inserts, which the table counts by tag too
(``TableOptions.tag_names``). Per logical table the collection counts what it asked
for: forwards that read the table (``lookups``), ids (with duplicates), unique ids,
and unique ids served from a stored row (``stored``: hits plus keys inserted by that
lookup; keys awaiting admission, refused, or missing in eval are not stored). ``size``
per logical table counts the entries carrying its tag; a ZCH table's, its rows held (its
storage's counters are its remapper's).
"""

from __future__ import annotations

import torch

from hashrec.embedding.ops.stats import take_unstored_by_tag


class TableCounters:
    """Running counts of one logical table; device-side sums avoid a sync per step.

    ``stored`` of a table whose lookups may leave keys unstored is summed on the
    device, into a (T,) tensor shared by the tables of its storage (index = tag),
    and read only when asked for.
    """

    def __init__(self) -> None:
        self.lookups = 0
        self.ids = 0
        self.unique_ids = 0
        self._stored_host = 0
        self._stored: torch.Tensor | None = None  # the storage's (T,) device sums
        self._tag = 0

    def record(self, ids: int, slots: torch.Tensor) -> None:
        """Adds one lookup of ``ids`` ids whose unique keys got ``slots`` (-1 = not stored)."""
        record_lookups([self], [ids], [slots.numel()], slots, None)

    @property
    def stored(self) -> int:
        device = 0 if self._stored is None else int(self._stored[self._tag])
        return self._stored_host + device


def record_lookups(counters: list[TableCounters], ids: list[int], unique: list[int],
                   slots: torch.Tensor | None, tags: torch.Tensor | None) -> None:
    """Adds one lookup of a storage to its tables' counters, in a few device ops.

    Args:
        counters: the counters of the tables read (by tag; None for an unread one).
        ids, unique: per table, ids and unique ids looked up (host ints).
        slots: (U,) slots of the unique keys, table by table (-1 = not stored), or
            None when every unique key is stored (dense tables without ZCH).
        tags: (U,) int32 table of each unique key, or None with one table.
    """
    read = [i for i, c in enumerate(counters) if c is not None]
    for i in read:
        c = counters[i]
        c.lookups, c.ids, c.unique_ids = c.lookups + 1, c.ids + ids[i], c.unique_ids + unique[i]
        # Every unique key counts as stored here; the device sums take the unstored off.
        c._stored_host += unique[i]
    if slots is None or not read:
        return
    sums = counters[read[0]]._stored
    if sums is None or sums.device != slots.device or sums.numel() != len(counters):
        sums = torch.zeros(len(counters), dtype=torch.int64, device=slots.device)
    for i in read:
        c = counters[i]
        if c._stored is not sums or c._tag != i:  # first lookup: the storage's sums
            c._stored_host, c._stored, c._tag = c.stored, sums, i
    if tags is None or len(counters) == 1:
        # -1 where a key is not stored, else 0: one op, no cast
        sums[read[0]:read[0] + 1].add_((slots >> 63).sum())
    else:
        take_unstored_by_tag(sums, slots, tags)


def _per_tag_sizes(storage) -> list[int]:
    tables = storage.plan.tables
    if not storage.plan.is_dynamic:
        return [storage.table.num_rows]
    if not storage.plan.fused:
        return [storage.table.size()]
    index = storage.table.storage
    tags = index.tags[index.digests != 0].to(torch.int64)
    return torch.bincount(tags, minlength=len(tables)).tolist()


def fused_table_sizes(storages) -> dict[str, dict[str, int]]:
    """{fused dynamic storage: {table: entries carrying its tag}}, tables in tag order."""
    return {s.name: dict(zip((spec.name for spec in s.plan.tables), _per_tag_sizes(s)))
            for s in storages if s.plan.is_dynamic and s.plan.fused}


def table_stats(counters: TableCounters, storage, tag: int, size: int) -> dict[str, float]:
    """One logical table's counters: storage, tag, size, lookups, ids, unique_ids, stored,
    stored_rate."""
    unique = counters.unique_ids
    return {
        "storage": storage.name, "tag": tag, "size": size, "lookups": counters.lookups,
        "ids": counters.ids, "unique_ids": unique, "stored": counters.stored,
        "stored_rate": counters.stored / unique if unique else 0.0,
    }


def storage_stats(storage, zch=None) -> dict[str, float]:
    """One storage's counters: the table's own (dynamic) plus load_factor and hit_rate;
    a ZCH table's (``zch``: its ``ZchRemapper``) its remapper's counters, counts as ints,
    plus hit_rate."""
    out = dict(storage.table.stats())
    if zch is not None:
        out.update({name: value if name == "load_factor" else int(value)
                    for name, value in zch.counters().items()})
    if storage.plan.is_dynamic:
        out["load_factor"] = storage.table.load_factor()
    if storage.plan.is_dynamic or zch is not None:
        out["hit_rate"] = out["hits"] / out["lookups"] if out.get("lookups") else 0.0
    out["tables"] = [spec.name for spec in storage.plan.tables]
    out["memory_bytes"] = storage.table.memory_bytes()
    return out


def _refusals(storage_out: dict, name: str, fused: bool) -> dict[str, int]:
    """A dynamic table's admission_rejected and refused: its tag's in a fused storage
    (``TableOptions.tag_names``), else its storage's."""
    return {counter: storage_out[f"{counter}/{name}" if fused else counter]
            for counter in ("admission_rejected", "refused")}


def collection_stats(storages, remappers: dict) -> dict[str, dict[str, dict]]:
    """{"tables": {table: table_stats}, "storages": {storage: storage_stats}}; counters per
    logical table are read from ``storage.counters``, a dynamic table's rejections and
    refusals from its storage's table, a ZCH table's (``remappers``: {table:
    ZchRemapper}) size from its remapper: rows held."""
    tables, storages_out = {}, {}
    for storage in storages:
        zch = None if storage.plan.is_dynamic else remappers.get(storage.name)
        out = storages_out[storage.name] = storage_stats(storage, zch)
        sizes = [out["size"]] if zch is not None else _per_tag_sizes(storage)
        for tag, spec in enumerate(storage.plan.tables):
            table = tables[spec.name] = table_stats(storage.counters[tag], storage, tag,
                                                    sizes[tag])
            if storage.plan.is_dynamic:
                table.update(_refusals(out, spec.name, storage.plan.fused))
    return {"tables": tables, "storages": storages_out}
