"""Features read from input a feature generation already encoded (``data_config.fg_mode``
FG_NONE or FG_BUCKETIZE, ``hashrec.config.fg_mode``), as TorchEasyRec reads it.

A feature then reads the column named as the feature itself, not its expression's field:
``cate`` reads ``cate``, sub-feature ``f`` of sequence ``s`` reads ``s__f``, and a combo
feature reads its one crossed column. A cell's values are separated by
``fg_encoded_multival_sep`` (chr(3) by default) or are a list cell; a sequence's items by
its ``sequence_delim``, an item's values by ``fg_encoded_multival_sep``, or a
``list<list<>>`` cell's lists are its items. A sequence item holds one value (the
sequence's value_dim 1): an item of several values, which a generation of value_dim 0
writes, is then an error naming its row (``SEVERAL_VALUES``); an id sequence of value_dim 0
reads all of an item's values, pooled into one embedding per item (its ``pooling``), as
TorchEasyRec does.

FG_NONE (encoded): every id is an integer and taken as it is: a row of a table of
num_buckets, hash_bucket_size, vocabulary or boundaries rows (it must lie below that), or
the raw key of a dynamic or ZCH table. A raw feature's values are used as they are (the
generation normalized them); with boundaries its cells hold bucket ids. A missing cell
reads as the feature's ``fg_encoded_default_value`` where set (it must read as a cell
would: checked when the feature is built), else as nothing (an empty bag; a dense raw
feature then refuses the row).

FG_BUCKETIZE: the generation left the bucketization to training: tokens are hashed, looked
up or bounded as from raw input, and a missing cell takes the feature's ``default_value``;
a raw feature's values are not normalized again.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from hashrec.config.errors import ConfigError
from hashrec.config.fg_mode import BUCKETIZE, ENCODED, RAW, fg_input, fg_input_setting
from hashrec.features.base import Feature
from hashrec.features.bucketize import ids_below, strict_int_ids
from hashrec.features.combo_feature import ComboFeature
from hashrec.features.errors import FeatureError
from hashrec.features.id_feature import IdFeature
from hashrec.features.raw_feature import RawFeature
from hashrec.features.tokens import Bags

DEFAULT_MULTIVAL_SEP = "\x03"
# Why an encoded sequence item of several values is refused, not read as its first value.
SEVERAL_VALUES = ("a sequence item holds one value here (value_dim 1, the sequence's "
                  "default): several values per item are what a feature generation of "
                  "value_dim 0 writes; set value_dim 0 on the feature to pool an item's "
                  "values into one embedding per item, as TorchEasyRec does")


@dataclass(frozen=True)
class EncodedIds:
    """Ids a feature generation bucketized: integers, kept as they are; each below
    ``limit`` where the table has that many rows (None: the raw keys of a dynamic or ZCH
    table, any int64)."""

    limit: int | None

    @property
    def num_rows(self) -> int | None:
        return self.limit

    def ids(self, bags: Bags, feature: str, column: str) -> np.ndarray:
        if self.limit is None:
            return strict_int_ids(bags, feature, column)
        return ids_below(bags, feature, column, self.limit,
                         f"the table's {self.limit} rows (an encoded id is a row)")


def _limit(feature: Feature) -> int | None:
    """The rows an encoded id of ``feature`` must lie below (None: raw keys)."""
    table = feature.table
    if table.dynamicemb is not None or table.zch is not None:
        return None
    return table.num_rows


def encoded_feature(feature: Feature, cfg, mode: str, multival_sep: str) -> Feature:
    """``feature`` (built from config ``cfg``) as it reads input of fg input ``mode``
    (``ENCODED`` or ``BUCKETIZE``).

    Raises:
        ConfigError: an ``fg_encoded_default_value`` that no cell of the feature could hold
            (an id that is no row, a word where numbers go, too few values).
    """
    sep = multival_sep or DEFAULT_MULTIVAL_SEP
    if mode == ENCODED:
        default = cfg.fg_encoded_default_value if cfg.HasField("fg_encoded_default_value") \
            else ""
    elif mode == BUCKETIZE:
        default = feature.default
    else:
        raise ValueError(f"fg input mode {mode!r} reads no encoded columns")
    # a sequence splits cells into items on its delimiter, an item's values on ``sep``
    outer = feature.separator if feature.is_sequence else sep
    inner = sep if feature.is_sequence else None
    encoded = _encoded_form(feature, mode, default, outer, inner)
    if mode == ENCODED and default:
        _check_default(encoded, default)
    return encoded


def _encoded_form(feature: Feature, mode: str, default: str, outer: str,
                  inner: str | None) -> Feature:
    """``feature`` reading the encoded column named after it, cells cut as ``outer`` and
    ``inner`` say, a missing one taking ``default``."""
    if isinstance(feature, RawFeature):
        if mode == ENCODED and feature.table is not None:  # cells hold bucket ids
            return IdFeature(feature.name, feature.name, EncodedIds(feature.table.num_rows),
                             feature.table, feature.pooling, outer, default,
                             sequence_length=feature.sequence_length,
                             sequence_name=feature.sequence_name, value_separator=inner,
                             several=_several(feature))
        return RawFeature(feature.name, feature.name, feature.value_dim, default, outer,
                          None, tuple(feature.boundaries), feature.table, feature.pooling,
                          feature.sequence_length, feature.sequence_name, inner,
                          default_field=_default_field(mode))
    if not isinstance(feature, (IdFeature, ComboFeature)):
        raise TypeError(f"feature {feature.name!r}: {type(feature).__name__} has no encoded "
                        f"form")
    bucketizer = EncodedIds(_limit(feature)) if mode == ENCODED else feature.bucketizer
    multi = getattr(feature, "multi_value", False)
    return IdFeature(feature.name, feature.name, bucketizer, feature.table, feature.pooling,
                     outer, default, feature.weighted, feature.sequence_length,
                     feature.sequence_name, inner, "" if multi else _several(feature),
                     multi_value=multi)


def _several(feature: Feature) -> str:
    """What an encoded sequence item of several values is refused with ("": no sequence)."""
    return SEVERAL_VALUES if feature.is_sequence else ""


def _check_default(feature: Feature, default: str) -> None:
    """A missing cell of ``feature`` takes ``default``: it must read as a cell would."""
    try:
        feature.parse(pa.table({feature.name: pa.array([None], pa.string())}))
    except FeatureError as err:
        # the error names the one-row table's row 0; the default is the config's
        detail = re.sub(r"^feature .*?: column .*? row 0: ", "", str(err))
        raise ConfigError(f"feature {feature.name!r}: fg_encoded_default_value {default!r} "
                          f"does not read as a cell of the feature: {detail}") from None


def _default_field(mode: str) -> str:
    return "fg_encoded_default_value" if mode == ENCODED else "default_value"


def _configs_by_name(configs) -> dict[str, object]:
    """Feature name -> its config, for ``(kind, config)`` pairs of the feature configs (a
    sequence's sub-feature ``f`` of ``s`` as ``s__f``)."""
    out = {}
    for kind, cfg in configs:
        if kind != "sequence_feature":
            out[cfg.feature_name] = cfg
            continue
        for sub in cfg.features:
            sub_cfg = getattr(sub, sub.WhichOneof("feature"))
            out[f"{cfg.sequence_name}__{sub_cfg.feature_name}"] = sub_cfg
    return out


def read_as_generated(features: list[Feature], configs, data_config) -> list[Feature]:
    """``features`` as they read the input ``data_config`` describes: as built for raw
    input, or each in its ``encoded_feature`` form for FG_NONE / FG_BUCKETIZE input.

    Args:
        features: the features built from ``configs``.
        configs: ``(kind, config)`` of each of ``pipeline_config.feature_configs``.
        data_config: the pipeline's DataConfig, or None.
    """
    mode = fg_input(data_config)
    if mode == RAW:
        return features
    by_name = _configs_by_name(configs)
    return [encoded_feature(f, by_name[f.name], mode, data_config.fg_encoded_multival_sep)
            for f in features]


def encoded_column_notes(features: list[Feature], data_config) -> dict[str, str]:
    """Column -> why it is read, for encoded input: each of ``features`` (as built for raw
    input) reads the column named as itself, not those it reads from raw input; empty for
    raw input. A file without the column names this in its error."""
    if fg_input(data_config) == RAW:
        return {}
    setting = fg_input_setting(data_config)
    notes = {}
    for f in features:
        fields = [c for c in f.columns if c != f.name]
        instead = f", not the {'column' if len(fields) == 1 else 'columns'} raw input " \
            f"would read ({', '.join(map(repr, fields))})" if fields else ""
        notes[f.name] = (f"{setting}, so feature {f.name!r} reads the column named as "
                         f"itself, as a feature generation writes it{instead}: read raw "
                         f"input with fg_mode FG_DAG, or encode it with "
                         f"python -m hashrec.tools.encode_input")
    return notes
