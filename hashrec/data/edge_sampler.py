"""The negative samplers that read user -> item edges: ``negative_sampler_v2``,
``hard_negative_sampler`` and ``hard_negative_sampler_v2``.

Besides ``negative_sampler``'s item table (here ``item_input_path``, same schema), they
read a user table (``user_input_path``: ``id``, ``weight``; checked, not drawn from) and
edge tables of TorchEasyRec's schema: a row per edge with ``src_id`` (a user id),
``dst_id`` (an item id) and optionally ``weight`` (read, not used), as parquet or text
whose first line names the columns, like the item table. A run reads every table once
(``read_sampler_tables``) and its samplers share that read.

- ``negative_sampler_v2``: ``num_sample`` items a batch (``num_eval_sample`` in
  evaluation where set), by weight with replacement, the k-th drawn for row
  ``k // ceil(num_sample / B)`` of the batch's B rows (the last row takes any rest), as
  TorchEasyRec conditions each draw on one row: never an item that the row's user
  (``user_id_field``) has a positive edge to (``pos_edge_input_path``). Such a draw is
  drawn again ``REDRAWS`` times, then from the items outside the user's positives. The
  batch's own items are not avoided (a user's own item should be one of its positives).
- ``hard_negative_sampler``: ``negative_sampler``'s draws (avoiding the batch's items),
  and, for each row, the items of its user's edges in ``hard_neg_edge_input_path``
  (exposed, not clicked, say): all of them up to ``num_hard_sample``, or that many of
  them drawn without replacement where the user has more, in the edge table's order. A
  user without hard edges (absent from the table, or a missing id) has none.
- ``hard_negative_sampler_v2``: ``negative_sampler_v2``'s draws and the hard negatives.

The sampled rows follow the batch's as ``negative_sampler``'s do: the ``num_sample``
shared negatives, then H = ``num_hard_sample`` slots a row (row i's at ``N + i * H + j``),
those past a row's hard negatives rows of missing values; ``Negatives.hard`` (B, H) bool
tells the filled slots, so that batches of a size have one shape whatever the users'
edges (the CUDA-graphed dense step needs that). All draws come from the generator the
caller passes: the same seed draws the same negatives.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from hashrec.data.errors import DataError
from hashrec.data.sampler import (
    REDRAWS,
    ItemTable,
    NegativeSampler,
    field_delimiter,
    read_item_table,
    read_table,
    sampler_where,
    table_files,
)


class Negatives(NamedTuple):
    """A hard-negative sampler's draw for a batch of B rows.

    Attributes:
        negatives: the N shared negatives' input rows, then B x H hard-negative slots.
        hard: (B, H) bool, which slots hold a hard negative.
    """

    negatives: pa.Table
    hard: np.ndarray


@dataclass(frozen=True)
class HardEdges:
    """Each user's hard-negative items as rows of the item table.

    Attributes:
        users: (u,) sorted distinct user ids.
        starts: (u + 1,) where each user's rows begin in ``rows``.
        rows: (e,) item-table rows, each user's in the edge table's order.
    """

    users: np.ndarray
    starts: np.ndarray
    rows: np.ndarray


@dataclass(frozen=True)
class PositiveEdges:
    """Users' positive items, as keys ``user index * items + item row``.

    Attributes:
        users: (u,) sorted distinct user ids (a user's index is its position).
        keys: (e,) sorted keys of the edges whose item is in the item table.
        items: the item table's row count.
    """

    users: np.ndarray
    keys: np.ndarray
    items: int


@dataclass(frozen=True)
class SamplerTables:
    """What a sampler with edge tables reads, read and checked once
    (``read_sampler_tables``) and shared by a run's samplers.

    Attributes:
        source: the sampler message's settings that the tables were read with.
        items: the item table.
        positives: the positive edges (None without ``pos_edge_input_path``).
        hard: the hard-negative edges (None without ``hard_neg_edge_input_path``).
    """

    source: tuple
    items: ItemTable
    positives: PositiveEdges | None
    hard: HardEdges | None


def _has(config, field: str) -> bool:
    return field in config.DESCRIPTOR.fields_by_name


def _source(config) -> tuple:
    paths = tuple(getattr(config, f) for f in ("user_input_path", "item_input_path",
                                                "pos_edge_input_path",
                                                "hard_neg_edge_input_path") if _has(config, f))
    return (*paths, tuple(config.attr_fields), config.attr_delimiter, field_delimiter(config))


def read_sampler_tables(config) -> SamplerTables:
    """The tables of the sampler message ``config`` (``NegativeSamplerV2``,
    ``HardNegativeSampler`` or ``HardNegativeSamplerV2``), read and checked.

    Raises:
        DataError: a table missing, unreadable or malformed (naming the field, file,
            column and row), or a hard edge to an item not in the item table.
    """
    where = sampler_where(config)
    delimiter = field_delimiter(config)
    _check_users(config.user_input_path, f"{where}.user_input_path", delimiter)
    items = read_item_table(config)
    order = np.argsort(items.ids, kind="stable")
    positives = hard = None
    if _has(config, "pos_edge_input_path"):
        field = f"{where}.pos_edge_input_path"
        src, dst = read_edges(config.pos_edge_input_path, field, delimiter)
        rows = _item_rows(items.ids, order, dst)
        users, index = np.unique(src, return_inverse=True)
        known = rows >= 0  # an edge to an item outside the table: never drawn anyway
        keys = np.unique(index[known].astype(np.int64) * len(items.ids) + rows[known])
        positives = PositiveEdges(users, keys, len(items.ids))
    if _has(config, "hard_neg_edge_input_path"):
        field = f"{where}.hard_neg_edge_input_path"
        src, dst = read_edges(config.hard_neg_edge_input_path, field, delimiter)
        rows = _item_rows(items.ids, order, dst)
        if (rows < 0).any():
            at = int(np.flatnonzero(rows < 0)[0])
            raise DataError(f"{field}: the edge of user {src[at]} to item {dst[at]} (edge "
                            f"{at}) names an item not in the item table "
                            f"({where}.item_input_path); a hard negative needs its attrs")
        by_user = np.argsort(src, kind="stable")
        users, counts = np.unique(src[by_user], return_counts=True)
        starts = np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)
        hard = HardEdges(users, starts, rows[by_user])
    return SamplerTables(_source(config), items, positives, hard)


def _item_rows(ids: np.ndarray, order: np.ndarray, wanted: np.ndarray) -> np.ndarray:
    """The item-table row of each of ``wanted`` ids (-1 where none; ``order`` sorts
    ``ids``)."""
    if not len(wanted):
        return np.zeros(0, dtype=np.int64)
    at = np.minimum(np.searchsorted(ids, wanted, sorter=order), len(ids) - 1)
    rows = order[at]
    return np.where(ids[rows] == wanted, rows, -1).astype(np.int64)


def read_edges(input_path: str, where: str, delimiter: str
               ) -> tuple[np.ndarray, np.ndarray]:
    """(src ids, dst ids) int64 of every edge of the files of ``input_path`` (``where``:
    its field, for errors)."""
    src, dst = [], []
    for path in table_files(input_path, where, "edge table"):
        table = read_table(path, delimiter, where, "edge table")
        missing = [c for c in ("src_id", "dst_id") if c not in table.column_names]
        if missing:
            raise DataError(f"{where} edge table {path}: no column {', '.join(missing)}; it "
                            f"needs src_id (user id), dst_id (item id) and optionally weight, "
                            f"as in TorchEasyRec (columns: {', '.join(table.column_names)})")
        columns = []
        for name in ("src_id", "dst_id"):
            try:
                column = pc.cast(table.column(name), pa.int64()).combine_chunks()
            except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as err:
                raise DataError(f"{where} edge table {path}: {name} must be integer ids: "
                                f"{err}") from None
            if column.null_count:
                row = int(np.flatnonzero(pc.is_null(column).to_numpy(zero_copy_only=False))[0])
                raise DataError(f"{where} edge table {path} row {row}: {name} is missing")
            columns.append(column.to_numpy())
        src.append(columns[0])
        dst.append(columns[1])
    return np.concatenate(src), np.concatenate(dst)


def _check_users(input_path: str, where: str, delimiter: str) -> None:
    """The user table exists and holds ``id`` (TorchEasyRec's graph needs it; the draws
    read the edges alone)."""
    for path in table_files(input_path, where, "user table"):
        table = read_table(path, delimiter, where, "user table")
        if "id" not in table.column_names:
            raise DataError(f"{where} user table {path}: no column id; it needs id (user id) "
                            f"and weight, as in TorchEasyRec (columns: "
                            f"{', '.join(table.column_names)})")


class EdgeNegativeSampler(NegativeSampler):
    """The sampler of a ``NegativeSamplerV2``, ``HardNegativeSampler`` or
    ``HardNegativeSamplerV2`` message (see the module docstring).

    Args:
        config: the sampler message.
        evaluation: draw ``num_eval_sample`` items a batch where it is set.
        tables: what ``read_sampler_tables(config)`` gave (a run reads them once for all
            its samplers); None reads them.

    Raises:
        DataError: a setting out of range (naming the field), or a table missing,
            unreadable or malformed.
        ValueError: ``tables`` read with other settings than ``config``'s.
    """

    def __init__(self, config, evaluation: bool = False,
                 tables: SamplerTables | None = None) -> None:
        where = sampler_where(config)
        if not config.user_id_field:
            raise DataError(f"{where}.user_id_field is empty; name the input column of the "
                            f"user id")
        self.num_hard = int(config.num_hard_sample) if _has(config, "num_hard_sample") else 0
        if _has(config, "num_hard_sample") and self.num_hard < 1:
            raise DataError(f"{where}.num_hard_sample={self.num_hard}; allowed: 1 or more "
                            f"hard negatives a row at most")
        if tables is None:
            tables = read_sampler_tables(config)
        elif tables.source != _source(config):
            raise ValueError(f"tables read from {tables.source}, not from this sampler's "
                             f"{_source(config)}")
        super().__init__(config, evaluation, tables.items)
        self.user_id_field = config.user_id_field
        self.positives, self.hard = tables.positives, tables.hard

    def sample(self, batch: pa.Table, rng: np.random.Generator) -> pa.Table | Negatives:
        """The negative rows of ``batch`` (an input block): ``num_sample`` shared ones, then
        with hard negatives B x ``num_hard_sample`` slots and their mask (``Negatives``).

        Raises:
            DataError: ``batch`` lacks ``item_id_field`` or ``user_id_field``, or an attr
                does not convert to its input column's type.
        """
        users, known = self._users(batch)
        if self.positives is not None:
            per_row = -(-self.num_sample // max(len(users), 1))
            drawer = np.minimum(np.arange(self.num_sample) // per_row, len(users) - 1)
            rows = self.draw_for_users(users[drawer], known[drawer], rng)
        else:
            rows = self.draw(self.batch_ids(batch, self.item_id_field, "item_id_field"), rng)
        if self.hard is None:
            return self.item_rows(batch, pa.array(rows))
        slots, mask = self.hard_slots(users, known, rng)
        taken = pa.array(np.concatenate([rows, slots.reshape(-1)]),
                         mask=np.concatenate([np.zeros(len(rows), bool),
                                              ~mask.reshape(-1)]))
        return Negatives(self.item_rows(batch, taken), mask)

    def _users(self, batch: pa.Table) -> tuple[np.ndarray, np.ndarray]:
        """Each row's user id (B,) int64 and whether it is set (B,) bool."""
        self.batch_ids(batch, self.user_id_field, "user_id_field")  # checks the column
        ids = pc.cast(batch.column(self.user_id_field), pa.int64())
        known = pc.is_valid(ids).to_numpy(zero_copy_only=False)
        return ids.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64), known

    def draw_for_users(self, users: np.ndarray, known: np.ndarray,
                       rng: np.random.Generator) -> np.ndarray:
        """One item-table row (int64) for each of ``users`` (``known``: the id is set), by
        weight, never one of the user's positive items."""
        index = self._user_index(self.positives.users, users, known)
        rows = self._weighted(len(users), rng)
        for _ in range(REDRAWS):
            again = np.flatnonzero(self._is_positive(index, rows))
            if not len(again):
                return rows
            rows[again] = self._weighted(len(again), rng)
        for k in np.flatnonzero(self._is_positive(index, rows)):
            rows[k] = self._draw_outside(int(index[k]), users[k], rng)
        return rows

    def _weighted(self, count: int, rng: np.random.Generator) -> np.ndarray:
        total = self._cumulative[-1]
        rows = np.searchsorted(self._cumulative, rng.random(count) * total, side="right")
        # rng.random() < 1, but total * u may round up to total
        return np.minimum(rows, len(self.ids) - 1).astype(np.int64)

    @staticmethod
    def _user_index(table_users: np.ndarray, users: np.ndarray, known: np.ndarray
                    ) -> np.ndarray:
        """Each user's position in ``table_users`` (sorted), -1 where absent or unset."""
        if not len(table_users):
            return np.full(len(users), -1, dtype=np.int64)
        at = np.minimum(np.searchsorted(table_users, users), len(table_users) - 1)
        return np.where(known & (table_users[at] == users), at, -1).astype(np.int64)

    def _is_positive(self, index: np.ndarray, rows: np.ndarray) -> np.ndarray:
        keys = index * self.positives.items + rows
        found = np.searchsorted(self.positives.keys, keys)
        found = np.minimum(found, max(len(self.positives.keys) - 1, 0))
        hit = self.positives.keys[found] == keys if len(self.positives.keys) else \
            np.zeros(len(keys), bool)
        return hit & (index >= 0)

    def _draw_outside(self, index: int, user: int, rng: np.random.Generator) -> int:
        """A row by weight among the items outside user ``index``'s positives."""
        n = self.positives.items
        keys = self.positives.keys
        mine = keys[np.searchsorted(keys, index * n):np.searchsorted(keys, (index + 1) * n)]
        weights = np.diff(self._cumulative, prepend=0.0)
        weights[mine - index * n] = 0.0
        total = weights.sum()
        if not total > 0:
            raise DataError(f"{self.where}: user {user} has a positive edge to every item of "
                            f"weight > 0 in the item table; there is no negative to draw")
        cumulative = np.cumsum(weights)
        return int(min(np.searchsorted(cumulative, rng.random() * total, side="right"),
                       len(cumulative) - 1))

    def hard_slots(self, users: np.ndarray, known: np.ndarray, rng: np.random.Generator
                   ) -> tuple[np.ndarray, np.ndarray]:
        """Each row's hard negatives: item-table rows (B, H) int64 (0 in empty slots) and
        which slots are filled (B, H) bool; a row's own first, up to H of them (drawn
        without replacement, kept in edge order, where its user has more)."""
        h = self.num_hard
        if not len(self.hard.rows):  # an edge table without edges
            return np.zeros((len(users), h), dtype=np.int64), np.zeros((len(users), h), bool)
        index = self._user_index(self.hard.users, users, known)
        present = index >= 0
        starts = np.where(present, self.hard.starts[np.maximum(index, 0)], 0)
        counts = np.where(present, self.hard.starts[np.maximum(index, 0) + 1] - starts, 0)
        # (B, H) offsets into the user's edges: the first H, or H drawn where it has more
        offsets = np.broadcast_to(np.arange(h), (len(users), h)).copy()
        for i in np.flatnonzero(counts > h):  # in row order, as the draws always were
            offsets[i] = np.sort(rng.choice(counts[i], h, replace=False))
        mask = offsets < counts[:, None]
        slots = np.where(mask, self.hard.rows[np.where(mask, starts[:, None] + offsets, 0)], 0)
        return slots.astype(np.int64), mask
