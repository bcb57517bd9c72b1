"""Feature kinds that only a feature generation computes (lookup_feature, match_feature,
expr_feature, overlap_feature, kv_dot_product, bool_mask_feature, combine_feature,
custom_feature): HashRec does not compute them from raw input, and reads them, as
TorchEasyRec does, from input a generation wrote (``data_config.fg_mode`` FG_NONE or
FG_BUCKETIZE), in the column named after the feature.

What a cell holds follows the feature's config, as for an id or raw feature:

- ``hash_bucket_size``, ``num_buckets``, ``vocab_list`` / ``vocab_dict``, ``dynamicemb``
  or ``zch`` (one of them; a bool_mask_feature always has one): ids of a table of that
  many rows (a vocabulary's: its entries, ``default_value`` and out-of-vocabulary ids, as
  for an id feature), or keys of a dynamic or ZCH table.
- ``boundaries``: bucket ids, a table of ``len(boundaries) + 1`` rows.
- neither: dense values, ``value_dim`` of them (1 where the kind has none or it is 0).

Here they are built as the id or raw feature of the same bucketization and a column of
their own name; ``hashrec.features.encoded`` then reads that column as it reads any
feature's under FG_NONE (ids taken as they are, ``fg_encoded_default_value`` for missing
cells) or FG_BUCKETIZE (tokens bucketized, ``default_value`` for missing cells). The
generation already combined, normalized and looked them up: ``combiner``, ``normalizer``
and the kinds' inputs are not read.
"""

from __future__ import annotations

from hashrec.config.errors import ConfigError
from hashrec.config.unused import is_set
from hashrec.features.base import Feature
from hashrec.features.bucketize import bucketizer_from_config
from hashrec.features.id_feature import IdFeature, table_request
from hashrec.features.raw_feature import (
    RawFeature,
    boundaries_of,
    bucket_table,
    check_no_embedding,
)

GENERATED_KINDS = ("lookup_feature", "match_feature", "expr_feature", "overlap_feature",
                   "kv_dot_product", "bool_mask_feature", "combine_feature", "custom_feature")
_BUCKETS = ("hash_bucket_size", "num_buckets", "dynamicemb", "zch", "vocab_list",
            "vocab_dict")


def build_generated_feature(kind: str, cfg) -> Feature:
    """The feature of a ``kind`` config (one of ``GENERATED_KINDS``), reading the column
    named after it.

    Raises:
        ConfigError: both boundaries and a bucketization, a bool_mask_feature without a
            bucketization, or what an id or raw feature of the same options refuses.
    """
    name = cfg.feature_name
    buckets = [f for f in _BUCKETS if is_set(cfg, f)]
    boundaries = boundaries_of(cfg.boundaries, name) if is_set(cfg, "boundaries") else ()
    if buckets and boundaries:
        raise ConfigError(f"feature {name!r}: set either boundaries or {buckets[0]}: the "
                          f"one says the generation's values are cut into buckets, the "
                          f"other that they are ids")
    if buckets or kind == "bool_mask_feature":
        bucketizer = bucketizer_from_config(cfg, name)
        return IdFeature(name, name, bucketizer,
                         table_request(cfg, name, bucketizer.num_rows, bucketizer),
                         cfg.pooling, None, cfg.default_value)
    if boundaries:
        return RawFeature(name, name, 1, cfg.default_value, None, None, boundaries,
                          bucket_table(cfg, name, boundaries), cfg.pooling)
    check_no_embedding(cfg, name, "a feature without boundaries or a bucketization")
    value_dim = max(int(cfg.value_dim), 1) if is_set(cfg, "value_dim") else 1
    return RawFeature(name, name, value_dim, cfg.default_value, None)
