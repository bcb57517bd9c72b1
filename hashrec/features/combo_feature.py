"""combo_feature: the cross product of several inputs' tokens, hashed to ids."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from hashrec.config.errors import ConfigError
from hashrec.features.base import Feature, SparseIds, check_pooling, column_of
from hashrec.features.bucketize import NumBuckets, Vocab, bucketizer_from_config
from hashrec.features.id_feature import table_request
from hashrec.features.tokens import Bags, column_bags, get_column, token_text

# Joins crossed tokens that are hashed; a control character that does not occur in ids.
CROSS_JOINER = "\x1f"
# Joins crossed tokens looked up in a vocabulary (vocab_list / vocab_dict / vocab_file),
# whose entries name crosses as TorchEasyRec's feature generation writes them: "a_b".
VOCAB_JOINER = "_"


def cross(left: Bags, right: Bags, joiner: str = CROSS_JOINER) -> Bags:
    """Per row, every (left, right) token pair joined by ``joiner``; left-major order."""
    lengths = left.lengths * right.lengths
    total = int(lengths.sum())
    left_off = np.concatenate([[0], np.cumsum(left.lengths)[:-1]])
    right_off = np.concatenate([[0], np.cumsum(right.lengths)[:-1]])
    out_off = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    local = np.arange(total) - np.repeat(out_off, lengths)
    width = np.repeat(right.lengths, lengths)
    li = np.repeat(left_off, lengths) + local // np.maximum(width, 1)
    ri = np.repeat(right_off, lengths) + local % np.maximum(width, 1)
    text = [token_text(b.values) for b in (left, right)]
    if text[0].type != text[1].type:  # a large_string token joins a string one as large
        text = [t.cast(pa.large_string()) for t in text]
    joined = pc.binary_join_element_wise(text[0].take(pa.array(li)), text[1].take(pa.array(ri)),
                                         pa.scalar(joiner, text[0].type))
    return Bags(joined, lengths.astype(np.int64))


class ComboFeature(Feature):
    """Crossed tokens of two or more columns, bucketized like an id feature."""

    def __init__(self, name: str, columns: tuple[str, ...], bucketizer, table, pooling: str,
                 separator: str | None, default: str) -> None:
        self.name = name
        self.columns = columns
        self.bucketizer = bucketizer
        self.table = table
        self.pooling = check_pooling(pooling, name)
        self.separator = separator
        self.default = default

    def parse(self, table: pa.Table | pa.RecordBatch) -> SparseIds:
        bags = None
        joiner = VOCAB_JOINER if isinstance(self.bucketizer, Vocab) else CROSS_JOINER
        for column in self.columns:
            part = column_bags(get_column(table, column, self.name), self.name, column,
                               self.separator)
            bags = part if bags is None else cross(bags, part, joiner)
        if self.default:  # as in TorchEasyRec: a row missing any input is the default
            bags = fill_empty(bags, self.default)
        ids = self.bucketizer.ids(bags, self.name, ",".join(self.columns))
        return SparseIds(ids, bags.lengths)


def fill_empty(bags: Bags, token: str) -> Bags:
    """``bags`` with ``token`` as the one token of each empty bag."""
    empty = bags.lengths == 0
    if not empty.any():
        return bags
    lengths = np.where(empty, 1, bags.lengths)
    starts = np.cumsum(bags.lengths) - bags.lengths
    row = np.repeat(np.arange(bags.batch_size), lengths)
    local = np.arange(int(lengths.sum())) - np.repeat(np.cumsum(lengths) - lengths, lengths)
    values = token_text(bags.values)
    take = np.where(empty[row], len(values), starts[row] + local)
    filled = pa.concat_arrays([values, pa.array([token], values.type)]).take(pa.array(take))
    return Bags(filled, lengths.astype(np.int64))


def build_combo_feature(cfg) -> ComboFeature:
    """ComboFeature from a ``combo_feature`` config."""
    name = cfg.feature_name
    # None: encoded input, which holds the crosses in the column named after the feature
    # (raw input without expressions is refused by validate.feature_problems).
    if len(cfg.expression) == 1:
        raise ConfigError(f"feature {name!r}: combo_feature needs at least two expressions")
    bucketizer = bucketizer_from_config(cfg, name)
    if isinstance(bucketizer, NumBuckets):
        raise ConfigError(f"feature {name!r}: combo_feature takes hash_bucket_size, vocab or "
                          f"dynamicemb, not num_buckets")
    columns = tuple(column_of(e, name) for e in cfg.expression) or (name,)
    table = table_request(cfg, name, bucketizer.num_rows, bucketizer)
    return ComboFeature(name, columns, bucketizer, table, cfg.pooling, cfg.separator,
                        cfg.default_value)
