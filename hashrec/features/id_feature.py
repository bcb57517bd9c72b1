"""id_feature and sequence_id_feature: tokens -> ids of an embedding table."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from hashrec.config.errors import ConfigError
from hashrec.features.base import (
    Feature,
    SparseIds,
    TableRequest,
    check_dim,
    check_not_sequence,
    check_pooling,
    expression_field,
)
from hashrec.features.bucketize import Bucketizer, bucketizer_from_config
from hashrec.features.data_type import data_type_of
from hashrec.features.errors import FeatureError
from hashrec.features.init_fn import init_fn_of
from hashrec.features.tokens import (
    Bags,
    column_bags,
    get_column,
    keep_items,
    list_lengths,
    present,
    sequence_items,
    truncate,
)

_WEIGHTED = r"^(?P<id>.*):(?P<weight>[^:]*)$"
# What a missing item of a sequence id feature without default_value reads as (TorchEasyRec
# resets such a default_value to it).
SEQUENCE_DEFAULT = "0"


def _is_finite_number(text: str) -> bool:
    try:
        return math.isfinite(float(text)) and text == text.strip() and "_" not in text
    except ValueError:
        return False


def _weights(text: pa.Array, bags: Bags, feature: str, column: str) -> np.ndarray:
    """(n,) float32 weights of ``text``; a non-number, NaN or inf names its row."""
    try:
        weights = pc.cast(text, pa.float32()).to_numpy(zero_copy_only=False)
        bad = ~np.isfinite(weights)
    except pa.ArrowInvalid:
        bad = np.array([not _is_finite_number(t) for t in text.to_pylist()], dtype=bool)
        if not bad.any():
            raise FeatureError(f"feature {feature!r}: column {column!r}: a weight is not a "
                               f"number") from None
    if bad.any():
        pos = int(np.flatnonzero(bad)[0])
        raise FeatureError(f"feature {feature!r}: column {column!r}", bags.row_of(pos),
                           f"weight {text[pos].as_py()!r} is not a finite number")
    return weights


def split_weighted(bags: Bags, feature: str, column: str) -> tuple[Bags, np.ndarray]:
    """``id:weight`` tokens -> (bags of ids, (n,) float32 weights)."""
    text = bags.values if pa.types.is_string(bags.values.type) else bags.values.cast(pa.string())
    parts = pc.extract_regex(text, _WEIGHTED)
    if parts.null_count:
        pos = int(np.flatnonzero(pc.is_null(parts).to_numpy(zero_copy_only=False))[0])
        raise FeatureError(f"feature {feature!r}: column {column!r}", bags.row_of(pos),
                           f"weighted value {text[pos].as_py()!r} is not id:weight")
    weights = _weights(parts.field("weight"), bags, feature, column)
    return Bags(parts.field("id"), bags.lengths), weights


class IdFeature(Feature):
    """Categorical ids (one or many per row) looked up in one table.

    Args:
        name: feature name.
        column: input column.
        bucketizer: how tokens become ids.
        table: the TableRequest of this feature.
        pooling: sum | mean.
        separator: multi-value separator inside string cells.
        default: token for missing cells ("" -> empty bag); of a weighted feature,
            ``id`` or ``id:weight`` (an ``id`` alone has weight 1).
        weighted: cells hold ``id:weight`` tokens.
        sequence_length: > 0 makes it a sequence (split on ``separator``,
            truncated to the first ``sequence_length`` items: the most recent).
        sequence_name: the sequence it reads items of (see ``Feature``); empty -> ``name``.
        value_separator: of a sequence, what separates the values of one item; an item
            is its first value (``value_dim`` 1), or all of them with ``multi_value``.
        several: of a sequence, why an item of several values cannot be read: such an
            item is then an error naming its row, not its first value ("": first value).
        multi_value: of a sequence, an item is all its values (``value_dim`` 0), which the
            embedding pools into one per item (``pooling``); the output then carries
            ``SparseIds.values_per_item`` and ``items_per_row``.
    """

    def __init__(self, name: str, column: str, bucketizer: Bucketizer, table: TableRequest,
                 pooling: str = "sum", separator: str | None = None, default: str = "",
                 weighted: bool = False, sequence_length: int = 0,
                 sequence_name: str = "", value_separator: str | None = None,
                 several: str = "", multi_value: bool = False) -> None:
        self.name = name
        self.columns = (column,)
        self.bucketizer = bucketizer
        self.table = table
        self.pooling = check_pooling(pooling, name)
        self.separator = separator
        self.default = f"{default}:1" if weighted and default and ":" not in default \
            else default
        self.weighted = weighted
        self.is_sequence = sequence_length > 0
        self.sequence_length = sequence_length
        self.sequence_name = (sequence_name or name) if self.is_sequence else ""
        self.value_separator = value_separator
        self.several = several
        self.multi_value = multi_value and self.is_sequence

    def parse(self, table: pa.Table | pa.RecordBatch) -> SparseIds:
        if self.is_sequence:
            items = self.items(table)
            return self.finish(keep_items(items, present(items.values)))
        column = self.columns[0]
        bags = column_bags(get_column(table, column, self.name), self.name, column,
                           self.separator, self.default)
        return self._ids(bags)

    def items(self, table: pa.Table | pa.RecordBatch) -> Bags:
        column = self.columns[0]
        return sequence_items(get_column(table, column, self.name), self.name, column,
                              self.separator, self.default, self.value_separator,
                              self.several, self.multi_value)

    def finish(self, items: Bags) -> SparseIds:
        items = truncate(items, self.sequence_length)
        if not self.multi_value:
            return self._ids(items)
        sizes = list_lengths(items.values)  # every item holds >= 1 value (item_values)
        rows = np.repeat(np.arange(items.batch_size), items.lengths)
        per_row = np.bincount(rows, weights=sizes, minlength=items.batch_size)
        values = Bags(pc.list_flatten(items.values), per_row.astype(np.int64))
        ids = self.bucketizer.ids(values, self.name, self.columns[0])
        return SparseIds(ids, values.lengths, None, sizes, items.lengths)

    def _ids(self, bags: Bags) -> SparseIds:
        column = self.columns[0]
        weights = None
        if self.weighted:
            bags, weights = split_weighted(bags, self.name, column)
        ids = self.bucketizer.ids(bags, self.name, column)
        return SparseIds(ids, bags.lengths, weights)


def table_request(cfg, name: str, num_rows: int | None,
                  bucketizer: Bucketizer | None = None) -> TableRequest:
    """TableRequest of an id-like config (embedding_name or the feature name)."""
    table = cfg.embedding_name if cfg.embedding_name else name
    dynamicemb = cfg.dynamicemb if "dynamicemb" in cfg.DESCRIPTOR.fields_by_name and \
        cfg.HasField("dynamicemb") else None
    return TableRequest(table, check_dim(cfg.embedding_dim, name), num_rows, dynamicemb,
                        cfg.trainable, getattr(bucketizer, "options", None),
                        init_fn_of(cfg, name), data_type_of(cfg, name))


def build_id_feature(cfg) -> IdFeature:
    """IdFeature from an ``id_feature`` config."""
    check_not_sequence(cfg, "id_feature")
    bucketizer = bucketizer_from_config(cfg, cfg.feature_name)
    return IdFeature(cfg.feature_name, expression_field(cfg, cfg.feature_name), bucketizer,
                     table_request(cfg, cfg.feature_name, bucketizer.num_rows, bucketizer),
                     cfg.pooling,
                     cfg.separator, cfg.default_value, cfg.weighted)


def sequence_default(cfg, name: str) -> str:
    """A sequence id feature's default_value: the config's, or ``SEQUENCE_DEFAULT`` where it
    is empty, as TorchEasyRec resets it (an empty or null cell is then one "0" item)."""
    return cfg.default_value or SEQUENCE_DEFAULT


def build_sequence_id_feature(cfg, name: str, column: str, sequence_length: int,
                              sequence_delim: str, bucketizer: Bucketizer,
                              table: TableRequest, sequence_name: str = "",
                              default: str | None = None) -> IdFeature:
    """IdFeature read as a sequence: items split on ``sequence_delim``, each its first value
    on ``separator`` (a sequence's ``value_dim`` is 1 unless set, as in TorchEasyRec), or
    all of them with ``value_dim`` 0 (pooled into one embedding per item); a
    missing item or cell reads as ``default`` (None: ``sequence_default``);
    ``sequence_name`` is its ``sequence_feature``'s name (empty for a top-level sequence
    feature)."""
    if sequence_length <= 0:
        raise ConfigError(f"feature {name!r}: sequence_length must be > 0")
    if cfg.weighted:
        # the items would be read as ids, "7:0.5" hashed whole
        raise ConfigError(f"feature {name!r}: weighted is not supported on sequence "
                          f"features; remove it")
    if cfg.HasField("value_dim") and cfg.value_dim > 1:
        raise ConfigError(f"feature {name!r}: value_dim {cfg.value_dim} is not supported on "
                          f"sequence features; set 0 (an item is all its values, split on "
                          f"separator, pooled into one embedding per item) or 1 (each "
                          f"item's first value, the default)")
    if default is None:
        default = sequence_default(cfg, name)
    multi = cfg.HasField("value_dim") and cfg.value_dim == 0
    return IdFeature(name, column, bucketizer, table, cfg.pooling, sequence_delim, default,
                     False, sequence_length, sequence_name, cfg.separator or None,
                     multi_value=multi)
