"""The logical tables of an embedding collection, as export reads them.

A dynamic storage may serve several logical tables (table fusion, one tag per
table); export splits it back into one (keys, values) pair per logical table,
so that a serving platform builds one hash map per table. Dense tables are
exported as their embedding columns (``rows[:, :dim]``, no optimizer state). Every
table is exported in the dtype it stores its rows in (float16 / bfloat16 for a
feature's ``data_type``), which the meta names. Zero-collision-hash tables are hash
maps too; every rank holds the whole (replicated) table, so each rank's part holds the
ids that rank owns as it would own dynamic keys, and the parts hold each id once.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from hashrec.export.errors import ExportError
from hashrec.table import HashTable
from hashrec.table.hashing import owner_of
from hashrec.table.options import InitializerMode

DEFAULT_CHUNK_ROWS = 1 << 20


@dataclass(frozen=True)
class DynamicTableView:
    """One logical dynamic table inside its storage.

    Attributes:
        name: logical table name.
        table: the storage's HashTable.
        tag: the table's namespace in a fused storage; None when it has the storage alone.
    """

    name: str
    table: HashTable
    tag: int | None

    @property
    def dim(self) -> int:
        return self.table.dim

    @property
    def dtype(self) -> torch.dtype:
        return self.table.options.dtype

    def chunks(self, chunk_rows: int = DEFAULT_CHUNK_ROWS
               ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Yields (keys (k,) int64, embeddings (k, dim) in ``dtype``) in slot order,
        k <= chunk_rows."""
        for keys, tags, rows, _ in self.table.export_state(chunk_rows):
            if self.tag is not None:
                mine = tags == self.tag
                keys, rows = keys[mine], rows[mine]
            yield keys, rows[:, :self.dim]

    def count(self, chunk_rows: int = DEFAULT_CHUNK_ROWS) -> int:
        """Number of stored keys of this logical table."""
        if self.tag is None:
            return int(self.table.size())
        return sum(int(keys.numel()) for keys, _ in self.chunks(chunk_rows))

    def missing_value(self) -> float:
        """What an id absent from the table reads as at inference (the eval initializer).

        Raises:
            ExportError: the eval initializer is not CONSTANT; its values are drawn at
                lookup time and cannot be reproduced by a static lookup structure.
        """
        args = self.table.options.eval_initializer
        if args.mode is not InitializerMode.CONSTANT:
            raise ExportError(
                f"table {self.name!r}: eval_initializer mode {args.mode.name} cannot be "
                f"exported; only CONSTANT (default 0) is supported for inference")
        return float(args.value)


@dataclass(frozen=True)
class ZchTableView:
    """A zero-collision-hash table exported as a hash map: raw id -> its slot's row.

    Ids without a slot read zeros, as in eval. Every rank holds the whole table; the
    view holds the ids that ``rank`` of ``world_size`` owns (``owner_of``), so that the
    parts of an export on several ranks hold each id once.
    """

    name: str
    table: object  # DenseTable
    remapper: object  # ZchRemapper
    rank: int = 0
    world_size: int = 1

    @property
    def dim(self) -> int:
        return self.table.dim

    @property
    def dtype(self) -> torch.dtype:
        return self.table.rows.dtype

    def _owned(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(raw ids, their slots) of this rank's part."""
        keys, slots, _, _ = self.remapper.assigned()
        if self.world_size > 1:
            mine = owner_of(keys, self.world_size) == self.rank
            keys, slots = keys[mine], slots[mine]
        return keys, slots

    def chunks(self, chunk_rows: int = DEFAULT_CHUNK_ROWS
               ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        keys, slots = self._owned()
        for start in range(0, int(keys.numel()), chunk_rows):
            part = slots[start:start + chunk_rows]
            yield keys[start:start + chunk_rows], self.table.rows[part, :self.dim].detach()

    def count(self, chunk_rows: int = DEFAULT_CHUNK_ROWS) -> int:
        return int(self._owned()[0].numel())

    def missing_value(self) -> float:
        return 0.0


def _zch_views(embedding, rank: int, world_size: int) -> list[ZchTableView]:
    remappers = getattr(embedding, "zch_remappers", {})
    return [ZchTableView(name, embedding.dense_tables[name], remapper, rank, world_size)
            for name, remapper in remappers.items()]


def dynamic_table_views(embedding, rank: int = 0, world_size: int = 1
                        ) -> list[DynamicTableView | ZchTableView]:
    """Logical dynamic tables of an ``EmbeddingCollection``, in table order, then its
    zero-collision-hash tables (exported as hash maps too), as rank ``rank`` of
    ``world_size`` exports them: the dynamic rows it holds, the ZCH ids it owns."""
    storages = embedding.dynamic_tables()
    locations = embedding.table_locations()
    sharing: dict[str, int] = {}
    for storage, _ in locations.values():
        sharing[storage] = sharing.get(storage, 0) + 1
    views = []
    for name, (storage, tag) in locations.items():
        if storage in storages:
            views.append(DynamicTableView(name, storages[storage],
                                          tag if sharing[storage] > 1 else None))
    return views + _zch_views(embedding, rank, world_size)


def dense_table_weights(embedding) -> dict[str, torch.Tensor]:
    """Dense tables' embedding columns: table name -> (num_rows, dim) in the rows' dtype (own
    memory: a table's rows may be a view into a group's matrix)."""
    tables = getattr(embedding, "dense_tables", {})
    zch = getattr(embedding, "zch_remappers", {})
    return {name: table.rows[:, :table.dim].detach().clone()
            for name, table in tables.items() if name not in zch}


def dense_network_tensors(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Parameters and buffers of the dense network (everything outside ``model.embedding``)."""
    return {name: tensor.detach() for name, tensor in model.state_dict().items()
            if not name.startswith("embedding.")}
