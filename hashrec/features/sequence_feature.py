"""Sequence features: sequence_feature groups and top-level sequence_id/raw features.

Sub-feature ``f`` of ``sequence_feature`` ``s`` is named ``s__f`` and reads
column ``s__<field>`` (``<field>`` from its expression). Cells are split on
``sequence_delim`` (or are ``list<>`` columns) and truncated to the first
``sequence_length`` items; sequences are stored most recent first, so the
most recent items are kept. An id item of several values (split on the
sub-feature's ``separator``) is its first value (``value_dim`` 1, a sequence's
default in TorchEasyRec), or all of its values with ``value_dim`` 0, pooled into one
embedding per item (other value_dims are refused); a raw item of several values is an
error.

A sub-feature without its own bucketization (no hash_bucket_size,
num_buckets, vocab or dynamicemb) and without embedding_name shares the
table and the bucketization of the top-level id feature reading the same
field (or, failing that, of the same name): ``click_50_seq__adgroup_id``
reads ``adgroup_id``'s table, in that table's ``data_type`` unless it sets one
of its own (which must then agree). A shared vocabulary is read as if the sub-feature
listed it itself: the sub-feature's default_value (not the owner's) is its id 0.

The sub-features of one ``sequence_feature`` read one sequence (their
``sequence_name`` is its name); a top-level sequence_id/raw feature is a
sequence of its own. Item i of every sub-feature describes the same item, so
the sub-features are parsed together (``parse_sequence``): every row must hold
as many items in each of their columns, and an item missing in one of them (empty
or null, with no default_value to take) is dropped from all of them.

As in TorchEasyRec, a missing item, and an empty or null cell, is one item of the
sub-feature's default_value: an id feature's is "0" where unset (TorchEasyRec resets
an empty one so), a raw feature's "0" unless set to "". A row whose cell is empty in
a sub-feature without a default has no item that sub-feature describes: it keeps none.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence

import numpy as np
import pyarrow as pa

from hashrec.config.errors import ConfigError
from hashrec.features.base import Feature, SparseIds, TableRequest, check_dim, expression_field
from hashrec.features.bucketize import Bucketizer, Vocab, bucketizer_from_config
from hashrec.features.data_type import data_type_of
from hashrec.features.errors import FeatureError
from hashrec.features.id_feature import (
    SEQUENCE_DEFAULT,
    IdFeature,
    build_sequence_id_feature,
    sequence_default,
    table_request,
)
from hashrec.features.init_fn import init_fn_of
from hashrec.features.raw_feature import RawFeature, build_raw_feature
from hashrec.features.tokens import keep_items, present

logger = logging.getLogger("hashrec.features")


def _shared_top_level(cfg, top_level: dict[str, IdFeature], name: str) -> IdFeature:
    field = expression_field(cfg, name)
    by_field = [f for f in top_level.values() if f.columns[0] == field]
    owner = by_field[0] if len(by_field) == 1 else top_level.get(cfg.feature_name)
    if owner is None:
        raise ConfigError(
            f"feature {name!r}: set one of hash_bucket_size, num_buckets, vocab_list, "
            f"vocab_dict or dynamicemb, or add a top-level id_feature reading {field!r} whose "
            f"table it can share")
    if check_dim(cfg.embedding_dim, name) != owner.table.dim:
        raise ConfigError(f"feature {name!r}: embedding_dim {cfg.embedding_dim} differs from "
                          f"the shared table {owner.table.name!r} (dim {owner.table.dim})")
    return owner


def _shared_bucketizer(bucketizer: Bucketizer, default: str) -> Bucketizer:
    """The owner's bucketization as the sub-feature reads it: a vocabulary gives the
    sub-feature's own default (``"0"`` where unset) id 0, as it would were the vocabulary
    repeated in the sub-feature's config (TorchEasyRec, where each feature lists its own
    vocabulary, puts a sequence feature's default_value at id 0)."""
    return bucketizer.with_default(default) if isinstance(bucketizer, Vocab) else bucketizer


def _sequence_id(cfg, name: str, column: str, length: int, delim: str,
                 top_level: dict[str, IdFeature], sequence_name: str = "") -> IdFeature:
    default = sequence_default(cfg, name)  # a vocabulary, its own or shared, reads it as id 0
    bucketizer = bucketizer_from_config(cfg, name, required=False, default_value=default)
    if bucketizer is None:
        owner = _shared_top_level(cfg, top_level, name)
        init = init_fn_of(cfg, name)
        dtype = data_type_of(cfg, name) if cfg.HasField("data_type") else owner.table.dtype
        if cfg.embedding_name:  # a table of its own, bucketized and drawn like the owner's
            table = TableRequest(cfg.embedding_name, owner.table.dim, owner.table.num_rows,
                                 owner.table.dynamicemb, cfg.trainable, owner.table.zch,
                                 init or owner.table.initializer, dtype)
        else:  # the owner's table: an init_fn or data_type of its own must agree (tables.py)
            table = dataclasses.replace(owner.table, initializer=init or owner.table.initializer,
                                        dtype=dtype)
        return build_sequence_id_feature(cfg, name, column, length, delim,
                                         _shared_bucketizer(owner.bucketizer, default),
                                         table, sequence_name, default)
    return build_sequence_id_feature(cfg, name, column, length, delim, bucketizer,
                                     table_request(cfg, name, bucketizer.num_rows, bucketizer),
                                     sequence_name, default)


def build_sequence_group(cfg, top_level: dict[str, IdFeature]) -> list[IdFeature | RawFeature]:
    """The sub-features of one ``sequence_feature`` config."""
    seq = cfg.sequence_name
    if cfg.sequence_length <= 0:
        raise ConfigError(f"sequence_feature {seq!r}: sequence_length must be > 0")
    features = []
    for sub_cfg in cfg.features:
        kind = sub_cfg.WhichOneof("feature")
        sub = getattr(sub_cfg, kind)
        name = f"{seq}__{sub.feature_name}"
        column = f"{seq}__{expression_field(sub, name)}"
        if kind == "id_feature":
            features.append(_sequence_id(sub, name, column, cfg.sequence_length,
                                         cfg.sequence_delim, top_level, seq))
        elif kind == "raw_feature":
            features.append(build_raw_feature(sub, name, column, cfg.sequence_length,
                                              cfg.sequence_delim, seq))
        else:
            raise ConfigError(f"feature {name!r}: sequence sub-feature kind {kind} is not "
                              f"supported")
    return features


def build_top_level_sequence(kind: str, cfg, top_level: dict[str, IdFeature]):
    """A ``sequence_id_feature`` or ``sequence_raw_feature`` config's feature."""
    name = cfg.feature_name
    column = expression_field(cfg, name)
    length = cfg.sequence_length
    if length <= 0:
        raise ConfigError(f"feature {name!r}: {kind} needs sequence_length > 0")
    if kind == "sequence_id_feature":
        return _sequence_id(cfg, name, column, length, cfg.sequence_delim, top_level)
    return build_raw_feature(cfg, name, column, length, cfg.sequence_delim)


def note_sequence_defaults(configs) -> None:
    """Log the sequence id features of raw input that read missing items as
    ``SEQUENCE_DEFAULT`` for want of a default_value; ``configs`` are ``(kind, config)``
    of the feature configs."""
    for kind, cfg in configs:
        if kind == "sequence_id_feature":
            subs = [(cfg.feature_name, cfg)]
        elif kind == "sequence_feature":
            subs = [(f"{cfg.sequence_name}__{sub.id_feature.feature_name}", sub.id_feature)
                    for sub in cfg.features if sub.WhichOneof("feature") == "id_feature"]
        else:
            continue
        for name, sub in subs:
            if not sub.default_value:
                logger.info("feature %r: a sequence id feature without default_value reads "
                            "missing items and empty cells as %r, as TorchEasyRec does", name,
                            SEQUENCE_DEFAULT)


def parse_sequence(features: Sequence[Feature], table: pa.Table | pa.RecordBatch
                   ) -> dict[str, SparseIds | np.ndarray]:
    """The outputs of the sub-features of one sequence, by name, parsed together.

    Raises:
        FeatureError: a row holds a different number of items in two of the columns.
    """
    items = [f.items(table) for f in features]
    # A row without items in one column (an empty or null cell without a default_value to
    # take) has no item that column describes: the row keeps none.
    empty = np.logical_or.reduce([bags.lengths == 0 for bags in items])
    if empty.any():
        items = [keep_items(bags, ~np.repeat(empty, bags.lengths)) for bags in items]
    first = items[0].lengths
    keep = None
    for feature, bags in zip(features, items):
        if not np.array_equal(bags.lengths, first):
            row = int(np.flatnonzero(bags.lengths != first)[0])
            raise FeatureError(
                f"sequence {features[0].sequence_name!r}: columns {features[0].columns[0]!r} "
                f"and {feature.columns[0]!r}", row,
                f"{first[row]} against {bags.lengths[row]} items; the sub-features of one "
                f"sequence describe the same items, so each row needs as many in every column")
        mask = present(bags.values)
        if mask is not None:
            keep = mask if keep is None else keep & mask
    return {f.name: f.finish(keep_items(bags, keep)) for f, bags in zip(features, items)}
