"""What every feature kind shares: its parsed output and the table it reads."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import torch

from hashrec.config.errors import ConfigError
from hashrec.features.tokens import Bags


@dataclass(frozen=True)
class SparseIds:
    """Parsed ids of one sparse feature: ``values`` (n,) int64, ``lengths`` (B,) int64,
    ``weights`` (n,) float32 or None.

    A sequence whose items hold several values (an id sequence's ``value_dim`` 0) also has
    ``values_per_item`` (m,) int64, the values of each item in order, and ``items_per_row``
    (B,) int64, the items of each row; ``lengths`` then counts each row's values."""

    values: np.ndarray
    lengths: np.ndarray
    weights: np.ndarray | None = None
    values_per_item: np.ndarray | None = None
    items_per_row: np.ndarray | None = None


@dataclass(frozen=True)
class TableRequest:
    """What a sparse feature asks of its embedding table (resolved by ``tables.py``).

    Attributes:
        name: table name: ``embedding_name`` or the feature name.
        dim: embedding dimension.
        num_rows: rows of a dense table; None for a dynamic table.
        dynamicemb: the feature's DynamicEmbedding message (dynamic tables).
        trainable: whether the table is updated.
        zch: ZchOptions of a zero-collision-hash table (``num_rows`` = zch_size), else None.
        initializer: InitializerArgs from the feature's ``init_fn``, else None (the
            table's default: dense tables uniform +-sqrt(1 / num_rows), dynamic tables
            their ``initializer_args``).
        dtype: dtype the table stores its rows in (the feature's ``data_type``).
    """

    name: str
    dim: int
    num_rows: int | None
    dynamicemb: object | None = None
    trainable: bool = True
    zch: object | None = None
    initializer: object | None = None
    dtype: torch.dtype = torch.float32


class Feature:
    """One configured feature. Subclasses set the attributes below and implement ``parse``.

    Attributes:
        name: feature name (the KeyedJaggedTensor key of sparse features).
        columns: input columns it reads.
        table: TableRequest of a sparse feature; None for dense raw features.
        pooling: ``sum`` or ``mean`` (sparse features).
        is_sequence: bags are sequences (padded, not pooled).
        sequence_length: maximum sequence length (sequence features).
        sequence_name: the sequence whose items a sequence feature reads: its
            ``sequence_feature``'s name, or its own name for a top-level
            ``sequence_*_feature``; empty for other features.
        weighted: sparse bags carry weights.
        value_dim: width of a dense raw feature (per item for sequences).
    """

    name: str
    columns: tuple[str, ...]
    table: TableRequest | None = None
    pooling: str = "sum"
    is_sequence: bool = False
    sequence_length: int = 0
    sequence_name: str = ""
    weighted: bool = False
    value_dim: int = 0

    @property
    def is_sparse(self) -> bool:
        return self.table is not None

    @property
    def output_dim(self) -> int:
        """Width of this feature's contribution to a feature group."""
        return self.table.dim if self.table is not None else self.value_dim

    def parse(self, table: pa.Table | pa.RecordBatch) -> SparseIds | np.ndarray:
        """Sparse features -> SparseIds; dense -> (B, value_dim) or (B, L, value_dim) float32."""
        raise NotImplementedError(f"{type(self).__name__}.parse")

    def items(self, table: pa.Table | pa.RecordBatch) -> Bags:
        """A sequence feature's items, every position kept (``tokens.sequence_items``):
        the missing ones (no default_value to take) are nulls."""
        raise NotImplementedError(f"{type(self).__name__}.items")

    def finish(self, items: Bags) -> SparseIds | np.ndarray:
        """A sequence feature's output from its items without nulls (truncated here)."""
        raise NotImplementedError(f"{type(self).__name__}.finish")


def expression_field(cfg, feature: str) -> str:
    """The input field a feature config's ``expression`` names (see :func:`column_of`), or
    the config's own ``feature_name`` where it sets no expression.

    Only configs of encoded input (fg_mode FG_NONE or FG_BUCKETIZE) may leave expression
    out, and that input holds the feature in the column named after it, which the field
    then names; raw input without expression is refused before any feature is built
    (``hashrec.config.validate.feature_problems``)."""
    if not cfg.HasField("expression"):
        return cfg.feature_name
    return column_of(cfg.expression, feature)


def column_of(expression: str, feature: str) -> str:
    """Input column named by an expression ``side:field`` (or a bare field)."""
    field = expression.split(":", 1)[1] if ":" in expression else expression
    if not field:
        raise ConfigError(f"feature {feature!r}: expression {expression!r} names no input field")
    return field


def check_pooling(pooling: str, feature: str) -> str:
    if pooling not in ("sum", "mean"):
        raise ConfigError(f"feature {feature!r}: pooling {pooling!r} is not supported; "
                          f"use sum or mean")
    return pooling


def check_dim(dim: int, feature: str) -> int:
    if dim <= 0:
        raise ConfigError(f"feature {feature!r}: embedding_dim must be > 0, got {dim}")
    return int(dim)


def check_not_sequence(cfg, kind: str) -> None:
    """A top-level id_feature or raw_feature is not read as a sequence; its sequence_length
    would be ignored, so setting it is an error that points at the sequence kinds."""
    if cfg.sequence_length:
        raise ConfigError(f"feature {cfg.feature_name!r}: sequence_length is set on a "
                          f"{kind}, which is not read as a sequence; declare it as a "
                          f"sequence_{kind} or inside a sequence_feature")
