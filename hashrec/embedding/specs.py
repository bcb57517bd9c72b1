"""What an embedding collection is built from: tables and the features that read them.

The feature layer turns a pipeline config into these specs (resolving
``embedding_name`` sharing and sequence sub-features); the embedding layer
builds storage from them. Neither side looks at the other's internals.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import torch

from hashrec.embedding.zch import ZchOptions
from hashrec.table import InitializerArgs, TableOptions
from hashrec.table.options import ROW_DTYPES


@dataclass(frozen=True)
class EmbeddingFeatureSpec:
    """One sparse input (a KeyedJaggedTensor key) and how its bags become embeddings.

    Attributes:
        name: output name, and the KeyedJaggedTensor key it reads unless ``key`` is set,
            e.g. ``user_id`` or ``click_50_seq__brand``.
        table: name of the table it reads.
        pooling: ``sum`` or ``mean`` over the bag (pooled features).
        is_sequence: True -> padded (B, max_length, dim) output plus lengths.
        max_length: sequence length (sequence features only).
        weighted: bags carry per-id weights (weighted pooling).
        key: the KeyedJaggedTensor key whose bags it reads when that is not ``name``:
            one input embedded by two tables (a feature of a WIDE feature group, see
            ``hashrec.features.wide``) has a second spec with a name of its own.
        multi_value: a sequence whose items hold several ids each (an id sequence's
            ``value_dim`` 0): its key's bags hold every id of a row's items, and key
            ``items_key(input_key)`` holds, per row, each item's number of ids; an item's
            ids are pooled (``pooling``) into its row of the (B, max_length, dim) output.
    """

    name: str
    table: str
    pooling: Literal["sum", "mean"] = "sum"
    is_sequence: bool = False
    max_length: int = 0
    weighted: bool = False
    key: str = ""
    multi_value: bool = False

    @property
    def input_key(self) -> str:
        """The KeyedJaggedTensor key it reads."""
        return self.key or self.name


# Suffix of the KeyedJaggedTensor key of a multi-value sequence's item sizes.
ITEMS_SUFFIX = "#items"


def items_key(key: str) -> str:
    """The KeyedJaggedTensor key holding the ids per item of multi-value sequence ``key``.

    Example::

        # s = [[item (7, 8), item (9)], [item (5)]]
        kjt = KeyedJaggedTensor.from_lengths(
            keys=["s", "s#items"],
            values=torch.tensor([7, 8, 9, 5,  2, 1, 1]),
            lengths=torch.tensor([3, 1,  2, 1]),
        )
    """
    return key + ITEMS_SUFFIX


@dataclass(frozen=True)
class EmbeddingTableSpec:
    """One embedding table: dense (``num_rows`` known) or dynamic (``dynamic`` options).

    Attributes:
        name: table name (the feature name or its ``embedding_name``).
        dim: embedding dimension.
        num_rows: rows of a dense table; None for dynamic tables.
        dynamic: TableOptions of a dynamic table; None for dense tables.
        features: names of the features that read this table.
        fusion_group: dynamic tables with the same non-None fusion_group, dim,
            optimizer and dtype may share one storage (with separate key spaces).
        dtype: dense tables only: dtype of the rows (embedding and optimizer state);
            None -> float32. Dynamic tables use ``dynamic.dtype``.
        trainable: False freezes the table (no sparse updates).
        initializer: dense tables only: how rows start; None -> uniform in
            +-sqrt(1 / num_rows) (TorchRec's default). Dynamic tables use
            ``dynamic.initializer``.
        zch: dense tables only: remap raw ids into the ``num_rows`` rows by zero-collision
            hashing (``num_rows`` must equal ``zch.zch_size``); see ``hashrec.embedding.zch``.
    """

    name: str
    dim: int
    num_rows: int | None = None
    dynamic: TableOptions | None = None
    features: tuple[str, ...] = field(default_factory=tuple)
    fusion_group: str | None = None
    trainable: bool = True
    initializer: InitializerArgs | None = None
    zch: ZchOptions | None = None
    dtype: torch.dtype | None = None

    def __post_init__(self) -> None:
        if (self.num_rows is None) == (self.dynamic is None):
            raise ValueError(
                f"table {self.name!r}: exactly one of num_rows (dense) and dynamic "
                f"(TableOptions) must be set")
        if self.num_rows is not None and self.num_rows <= 0:
            raise ValueError(f"table {self.name!r}: num_rows must be > 0, got {self.num_rows}")
        if self.initializer is not None and self.dynamic is not None:
            raise ValueError(
                f"table {self.name!r}: initializer is for dense tables; set "
                f"dynamic.initializer instead")
        if self.dtype is not None and self.dynamic is not None:
            raise ValueError(
                f"table {self.name!r}: dtype is for dense tables; set dynamic.dtype instead")
        if self.dtype is not None and self.dtype not in ROW_DTYPES:
            raise ValueError(f"table {self.name!r}: dtype={self.dtype!r} is not valid; "
                             f"allowed: {ROW_DTYPES}")
        if self.zch is not None and self.num_rows != self.zch.zch_size:
            raise ValueError(
                f"table {self.name!r}: zch needs num_rows == zch.zch_size, got num_rows="
                f"{self.num_rows} and zch_size={self.zch.zch_size}")
        if self.dim <= 0:
            raise ValueError(f"table {self.name!r}: dim must be > 0, got {self.dim}")

    @property
    def is_dynamic(self) -> bool:
        return self.dynamic is not None

    @property
    def row_dtype(self) -> torch.dtype:
        """The dtype the table's rows are stored in."""
        if self.dynamic is not None:
            return self.dynamic.dtype
        return torch.float32 if self.dtype is None else self.dtype
