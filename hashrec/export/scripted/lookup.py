"""Scriptable embedding lookups: tables as tensors, features pooled or padded.

``TableLookup`` maps ids (n,) int64 to float32 rows (n, dim); it keeps the table in the
dtype it was trained in (float16 / bfloat16 tables stay half the size) and converts
the rows it reads. A hash map table holds
its keys sorted and finds each id with ``torch.searchsorted``; an id that is not
stored reads as ``missing`` (the eval initializer). A dense table holds its
matrix and indexes it directly; ids outside [0, num_rows) raise.

``EmbeddingLookup`` reproduces the eval-mode embedding collection: pooled
features sum (or average, optionally weighted) their bags; sequence features
keep their first ``max_length`` ids and pad to (B, max_length, dim) with zeros; a
multi-value sequence (``multi_value``) pools each item's ids (its sizes are input
``<key>#items``: per item, its ids; per row, its items) and pads the items. Its inputs
are per-feature ``values`` (n,) and ``lengths`` (B,) tensors; a feature
that two tables embed (a WIDE group's) is read once per table.
"""


from dataclasses import dataclass

import torch
from torch import nn


class TableLookup(nn.Module):
    """One embedding table as tensors.

    Args:
        name: table name (error messages).
        values: (rows, dim) embeddings, float32, float16 or bfloat16 (kept as given).
        keys: hash map tables: (rows,) int64 keys sorted ascending, parallel to
            ``values``; None for a dense table (row i is id i).
        missing: what an absent key reads as (hash maps only).
    """

    name: str
    is_hashmap: bool

    def __init__(self, name: str, values: torch.Tensor, keys: torch.Tensor | None = None,
                 missing: float = 0.0) -> None:
        super().__init__()
        self.name = name
        self.is_hashmap = keys is not None
        dim = values.shape[1]
        self.register_buffer("values", values.contiguous())
        self.register_buffer("keys", (keys if keys is not None
                                      else torch.empty(0, dtype=torch.int64)).contiguous())
        self.register_buffer("missing", torch.full((1, dim), float(missing)))

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids (n,) int64 -> rows (n, dim) float32."""
        if not self.is_hashmap:
            num_rows = self.values.shape[0]
            if ids.numel() > 0 and bool(((ids < 0) | (ids >= num_rows)).any()):
                raise RuntimeError("table " + self.name + ": ids outside [0, "
                                   + str(num_rows) + ")")
            return self.values.index_select(0, ids).float()
        count = self.keys.numel()
        if count == 0:
            return self.missing.expand(ids.numel(), self.missing.shape[1]).clone()
        position = torch.searchsorted(self.keys, ids).clamp_(max=count - 1)
        found = self.keys.index_select(0, position) == ids
        rows = self.values.index_select(0, position).float()
        return torch.where(found.unsqueeze(1), rows, self.missing)


@dataclass(frozen=True)
class FeatureLayout:
    """How one sparse feature reads its table (mirrors EmbeddingFeatureSpec; ``key``: the
    input it reads when that is not ``name``)."""

    name: str
    table: str
    mean: bool = False
    is_sequence: bool = False
    max_length: int = 0
    weighted: bool = False
    key: str = ""
    multi_value: bool = False


def _offsets(lengths: torch.Tensor) -> torch.Tensor:
    offsets = torch.zeros(lengths.numel() + 1, dtype=torch.int64, device=lengths.device)
    offsets[1:] = torch.cumsum(lengths, 0)
    return offsets


class EmbeddingLookup(nn.Module):
    """Features' embeddings from their tables (see the module docstring).

    Args:
        tables: one TableLookup per table.
        features: the sparse features, in any order; each names a table of ``tables``.
    """

    feature_names: list[str]
    input_keys: list[str]
    mean: list[bool]
    is_sequence: list[bool]
    max_length: list[int]
    weighted: list[bool]
    multi_value: list[bool]
    readers: list[list[int]]

    def __init__(self, tables: list[TableLookup], features: list[FeatureLayout]) -> None:
        super().__init__()
        self.tables = nn.ModuleList(tables)
        index = {table.name: i for i, table in enumerate(tables)}
        self.feature_names = [f.name for f in features]
        self.input_keys = [f.key or f.name for f in features]
        self.mean = [f.mean for f in features]
        self.is_sequence = [f.is_sequence for f in features]
        self.max_length = [f.max_length for f in features]
        self.weighted = [f.weighted for f in features]
        self.multi_value = [f.multi_value for f in features]
        self.readers = [[] for _ in tables]
        for i, feature in enumerate(features):
            self.readers[index[feature.table]].append(i)

    def _pool(self, i: int, rows: torch.Tensor, lengths: torch.Tensor,
              weights: dict[str, torch.Tensor]) -> torch.Tensor:
        if self.weighted[i]:
            rows = rows * weights[self.input_keys[i]].float().unsqueeze(1)
        batch = lengths.numel()
        bags = torch.repeat_interleave(torch.arange(batch, device=rows.device), lengths)
        out = torch.zeros(batch, rows.shape[1], dtype=torch.float32, device=rows.device)
        out.index_add_(0, bags, rows)
        if self.mean[i]:
            out = out / lengths.clamp(min=1).to(out.dtype).unsqueeze(1)
        return out

    def _truncate(self, i: int, ids: torch.Tensor, lengths: torch.Tensor
                  ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """A sequence's first max_length ids: (ids, their positions, clamped lengths)."""
        max_length = self.max_length[i]
        position = torch.arange(ids.numel(), device=ids.device) - \
            _offsets(lengths)[:-1].repeat_interleave(lengths)
        kept = position < max_length
        return ids[kept], position[kept], lengths.clamp(max=max_length)

    def _pad(self, i: int, rows: torch.Tensor, position: torch.Tensor,
             lengths: torch.Tensor) -> torch.Tensor:
        max_length = self.max_length[i]
        batch = lengths.numel()
        sequence = torch.repeat_interleave(torch.arange(batch, device=rows.device), lengths)
        out = torch.zeros(batch * max_length, rows.shape[1], dtype=torch.float32,
                          device=rows.device)
        out.index_copy_(0, sequence * max_length + position, rows)
        return out.view(batch, max_length, rows.shape[1])

    def _items(self, i: int, rows: torch.Tensor, values: dict[str, torch.Tensor],
               lengths: dict[str, torch.Tensor], weights: dict[str, torch.Tensor]
               ) -> tuple[torch.Tensor, torch.Tensor]:
        """A multi-value sequence: its items' rows pooled, the first max_length items
        padded -> ((B, max_length, dim), lengths (B,))."""
        key = self.input_keys[i] + "#items"
        if key not in values or key not in lengths:
            raise RuntimeError("missing input values/lengths of feature " + key)
        sizes = values[key].to(torch.int64)
        items = lengths[key].to(torch.int64)
        pooled = self._pool(i, rows, sizes, weights)
        position = torch.arange(sizes.numel(), device=sizes.device) - \
            _offsets(items)[:-1].repeat_interleave(items)
        kept = position < self.max_length[i]
        items = items.clamp(max=self.max_length[i])
        return self._pad(i, pooled[kept], position[kept], items), items

    def forward(self, values: dict[str, torch.Tensor], lengths: dict[str, torch.Tensor],
                weights: dict[str, torch.Tensor]
                ) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor],
                           dict[str, torch.Tensor]]:
        """Per-feature ids -> (pooled {name: (B, dim)}, sequences {name: (B, L, dim)},
        sequence lengths {name: (B,)})."""
        pooled: dict[str, torch.Tensor] = {}
        sequences: dict[str, torch.Tensor] = {}
        sequence_lengths: dict[str, torch.Tensor] = {}
        for t, table in enumerate(self.tables):
            for i in self.readers[t]:
                name = self.feature_names[i]
                key = self.input_keys[i]
                if key not in values or key not in lengths:
                    raise RuntimeError("missing input values/lengths of feature " + key)
                ids = values[key].to(torch.int64)
                bag_lengths = lengths[key].to(torch.int64)
                if self.multi_value[i]:
                    sequences[name], sequence_lengths[name] = self._items(
                        i, table(ids), values, lengths, weights)
                elif self.is_sequence[i]:
                    ids, position, bag_lengths = self._truncate(i, ids, bag_lengths)
                    sequences[name] = self._pad(i, table(ids), position, bag_lengths)
                    sequence_lengths[name] = bag_lengths
                else:
                    pooled[name] = self._pool(i, table(ids), bag_lengths, weights)
        return pooled, sequences, sequence_lengths
