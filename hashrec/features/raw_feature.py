"""raw_feature and sequence_raw_feature: numbers -> dense values or bucket ids."""

from __future__ import annotations

import math

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import torch

from hashrec.config.errors import ConfigError
from hashrec.config.floats import proto_float
from hashrec.config.normalizer import Normalizer
from hashrec.features.base import (
    Feature,
    SparseIds,
    TableRequest,
    check_dim,
    check_pooling,
    expression_field,
)
from hashrec.features.data_type import data_type_of
from hashrec.features.errors import FeatureError
from hashrec.features.init_fn import init_fn_of
from hashrec.features.tokens import (
    Bags,
    column_bags,
    first_not_converting,
    get_column,
    keep_items,
    missing_cells,
    present,
    sequence_items,
    truncate,
)

_FLOAT32_MAX = float(np.finfo(np.float32).max)


def float_values(bags: Bags, feature: str, column: str) -> np.ndarray:
    """Tokens as float64; non-numbers, NaN and inf are errors naming the row."""
    try:
        values = pc.cast(bags.values, pa.float64()).to_numpy(zero_copy_only=False)
    except pa.ArrowNotImplementedError:
        raise FeatureError(f"feature {feature!r}: column {column!r} holds values that are not "
                           f"numbers ({bags.values.type})") from None
    except pa.ArrowInvalid:
        pos = first_not_converting(bags.values, pa.float64())
        raise FeatureError(f"feature {feature!r}: column {column!r}", bags.row_of(pos),
                           f"value {bags.values[pos].as_py()!r} is not a number") from None
    bad = ~np.isfinite(values)
    if bad.any():
        pos = int(np.flatnonzero(bad)[0])
        raise FeatureError(f"feature {feature!r}: column {column!r}", bags.row_of(pos),
                           f"value {values[pos]} is not finite (NaN/inf are not allowed)")
    return values


class RawFeature(Feature):
    """Numeric values: dense (B, value_dim), or bucket ids when ``boundaries`` are set.

    Bucket ids: value v -> the number of boundaries <= v, in [0, len(boundaries)].
    A sequence (``sequence_length`` > 0) reads the items of ``sequence_name`` (see
    ``Feature``; empty -> ``name``), one value each: an item holding several values
    (separated by ``value_separator``) is an error naming its row.
    """

    def __init__(self, name: str, column: str, value_dim: int, default: str,
                 separator: str | None, normalizer: Normalizer | None = None,
                 boundaries: tuple[float, ...] = (), table: TableRequest | None = None,
                 pooling: str = "sum", sequence_length: int = 0,
                 sequence_name: str = "", value_separator: str | None = None,
                 default_field: str = "default_value") -> None:
        self.name = name
        self.columns = (column,)
        self.value_dim = value_dim
        self.default = default
        self.separator = separator
        self.normalizer = normalizer
        self.boundaries = np.asarray(boundaries, dtype=np.float64)
        self.table = table
        self.pooling = check_pooling(pooling, name)
        self.is_sequence = sequence_length > 0
        self.sequence_length = sequence_length
        self.sequence_name = (sequence_name or name) if self.is_sequence else ""
        self.value_separator = value_separator
        self.default_field = default_field

    def _values(self, bags: Bags, defaulted: np.ndarray | None = None) -> np.ndarray:
        """The bags' values, normalized but where ``defaulted`` (a (B,) bool of rows that
        took ``default_value``): as in TorchEasyRec, the default is not normalized.

        A value the normalizer turns into NaN or an infinity (an expression's ``log(0)``),
        or, fed to the model as it is, into more than float32 holds, is an error naming
        the row, as a NaN read from the column is."""
        values = float_values(bags, self.name, self.columns[0])
        if self.normalizer is None:
            return values
        normalized = self.normalizer(values)
        if defaulted is not None and defaulted.any():
            kept = np.repeat(defaulted, bags.lengths)
            normalized = np.where(kept, values, normalized)
        bad = ~np.isfinite(normalized)
        if self.table is None:  # fed to the model as float32
            bad |= np.abs(normalized) > _FLOAT32_MAX
        if bad.any():
            pos = int(np.flatnonzero(bad)[0])
            beyond = "" if self.table is not None else " or beyond float32's range"
            fix = "make the expression finite for every value the column holds (e.g. " \
                "x > 0 ? log(x) : 0)" if self.normalizer.method == "expression" else \
                "check the normalizer's parameters"
            raise FeatureError(
                f"feature {self.name!r}: column {self.columns[0]!r}", bags.row_of(pos),
                f"value {values[pos]:g} becomes {normalized[pos]:g} under normalizer "
                f"{self.normalizer.text!r}, which is not finite{beyond}; {fix}, or clean "
                f"the input")
        return normalized

    def items(self, table) -> Bags:
        column = self.columns[0]
        items = sequence_items(get_column(table, column, self.name), self.name, column,
                               self.separator, self.default)
        text = items.values
        if self.value_separator and (pa.types.is_string(text.type)
                                     or pa.types.is_large_string(text.type)):
            several = pc.fill_null(pc.match_substring(text, self.value_separator), False)
            if pc.any(several).as_py():
                pos = int(np.flatnonzero(several.to_numpy(zero_copy_only=False))[0])
                raise FeatureError(
                    f"feature {self.name!r}: column {column!r}", items.row_of(pos),
                    f"item {text[pos].as_py()!r} holds several values (separated by "
                    f"{self.value_separator!r}); a sequence raw feature reads one value "
                    f"per item (value_dim 1)")
        return items

    def finish(self, items: Bags) -> SparseIds | np.ndarray:
        return self._output(truncate(items, self.sequence_length))

    def parse(self, table) -> SparseIds | np.ndarray:
        if self.is_sequence:
            items = self.items(table)
            return self.finish(keep_items(items, present(items.values)))
        column = self.columns[0]
        array = get_column(table, column, self.name)
        bags = column_bags(array, self.name, column, self.separator, self.default)
        defaulted = missing_cells(array) if self.normalizer is not None and self.default \
            else None
        return self._output(bags, defaulted)

    def _output(self, bags: Bags, defaulted: np.ndarray | None = None) -> SparseIds | np.ndarray:
        values = self._values(bags, defaulted)
        if self.table is not None:
            ids = np.searchsorted(self.boundaries, values, side="right").astype(np.int64)
            return SparseIds(ids, bags.lengths)
        if self.is_sequence:
            return self._padded(bags, values)
        wrong = bags.lengths != self.value_dim
        if wrong.any():
            row = int(np.flatnonzero(wrong)[0])
            raise FeatureError(f"feature {self.name!r}: column {self.columns[0]!r}", row,
                               f"has {bags.lengths[row]} values, expected value_dim="
                               f"{self.value_dim}{self._default_hint()}")
        return values.astype(np.float32).reshape(bags.batch_size, self.value_dim)

    def _default_hint(self) -> str:
        """What to set so that missing cells give value_dim values."""
        if not self.default:
            return f" (set {self.default_field} for missing cells)"
        items = len(self.default.split(self.separator)) if self.separator else 1
        if items == self.value_dim:
            return ""
        sep = f" separated by {self.separator!r}" if self.separator else \
            " (and a separator to split them)"
        return (f" (a missing cell takes {self.default_field} {self.default!r}, {items} value(s); "
                f"give it {self.value_dim} values{sep})")

    def _padded(self, bags: Bags, values: np.ndarray) -> np.ndarray:
        out = np.zeros((bags.batch_size, self.sequence_length, 1), dtype=np.float32)
        offsets = np.concatenate([[0], np.cumsum(bags.lengths)[:-1]])
        rows = np.repeat(np.arange(bags.batch_size), bags.lengths)
        cols = np.arange(len(values)) - np.repeat(offsets, bags.lengths)
        out[rows, cols, 0] = values
        return out


def boundaries_of(values, feature: str) -> tuple[float, ...]:
    """The configured boundaries as the decimals written in the config.

    The config field is float32, so ``0.1`` arrives as 0.10000000149; compared with
    float64 values as it is, a value of exactly 0.1 would fall below its boundary.
    Each boundary is read back as the shortest decimal of its float32 (``proto_float``).
    """
    out = []
    for value in values:
        if not math.isfinite(value):
            raise ConfigError(f"feature {feature!r}: boundaries must be finite, got {value}")
        out.append(proto_float(value))
    for before, after in zip(out, out[1:]):
        if after <= before:
            raise ConfigError(f"feature {feature!r}: boundaries must be strictly ascending, "
                              f"got {after:g} after {before:g} in {[f'{b:g}' for b in out]}")
    return tuple(out)


def bucket_table(cfg, name: str, boundaries: tuple[float, ...]) -> TableRequest:
    """The table of the bucket ids that ``boundaries`` cut feature ``name``'s values into."""
    return TableRequest(cfg.embedding_name or name, check_dim(cfg.embedding_dim, name),
                        len(boundaries) + 1, None, cfg.trainable,
                        initializer=init_fn_of(cfg, name), dtype=data_type_of(cfg, name))


def check_no_embedding(cfg, name: str, what: str) -> None:
    """A feature of dense values (``what``: which) has no embedding: its init_fn or
    data_type would do nothing, so setting one is a ConfigError."""
    if cfg.init_fn:
        raise ConfigError(f"feature {name!r}: init_fn initializes an embedding, and {what} "
                          f"has none; remove it")
    if data_type_of(cfg, name) != torch.float32:
        raise ConfigError(f"feature {name!r}: data_type {cfg.data_type} sets how an "
                          f"embedding is stored, and {what} has none; remove it")


def build_raw_feature(cfg, name: str | None = None, column: str | None = None,
                      sequence_length: int = 0, sequence_delim: str | None = None,
                      sequence_name: str = "") -> RawFeature:
    """RawFeature from a ``raw_feature`` config (or a sequence's raw sub-feature, of the
    ``sequence_feature`` named ``sequence_name``)."""
    name = name or cfg.feature_name
    column = column or expression_field(cfg, name)
    boundaries = boundaries_of(cfg.boundaries, name)
    if cfg.value_dim < 1:
        raise ConfigError(f"feature {name!r}: value_dim must be >= 1, got {cfg.value_dim}")
    if sequence_length and cfg.value_dim != 1:
        raise ConfigError(f"feature {name!r}: sequence raw features with value_dim > 1 are not "
                          f"supported")
    table = bucket_table(cfg, name, boundaries) if boundaries else None
    if not boundaries:
        check_no_embedding(cfg, name, "a raw_feature without boundaries")
    normalizer = Normalizer.parse(cfg.normalizer, name) if cfg.normalizer else None
    separator = sequence_delim if sequence_length else cfg.separator
    return RawFeature(name, column, int(cfg.value_dim), cfg.default_value, separator,
                      normalizer, boundaries, table, cfg.pooling, sequence_length,
                      sequence_name, (cfg.separator or None) if sequence_length else None)
