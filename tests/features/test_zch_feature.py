"""zch on id features (hashrec/features/zch.py): config -> raw ids and a ZCH table spec."""

from __future__ import annotations

import pyarrow as pa
import pytest

from hashrec.config import parse_pipeline_config
from hashrec.config.errors import ConfigError
from hashrec.embedding.zch import ZchOptions
from hashrec.features import build_feature_set


def feature_set(zch: str, extra: str = ""):
    return build_feature_set(parse_pipeline_config(
        f'model_dir: "m"\nfeature_configs {{ id_feature {{ feature_name: "u" expression: "user:uid" '
        f'embedding_dim: 4 zch {{ {zch} }} }} }}\n{extra}'))


@pytest.mark.parametrize("zch, options", [
    ("zch_size: 10", ZchOptions(10, 5, "LFU", 1.0)),
    ("zch_size: 10 eviction_interval: 2 lru { decay_exponent: 2 }",
     ZchOptions(10, 2, "LRU", 2.0)),
    ("zch_size: 7 distance_lfu { decay_exponent: 0.5 }", ZchOptions(7, 5, "DISTANCE_LFU", 0.5)),
], ids=["default-lfu", "lru", "distance-lfu"])
def test_zch_config_gives_a_remapped_dense_table(zch, options):
    fs = feature_set(zch)
    (table,) = fs.embedding_tables()
    assert table.num_rows == options.zch_size and table.zch == options and not table.is_dynamic


def test_zch_ids_are_raw_ids():
    fs = feature_set("zch_size: 4")
    batch = fs.parse(pa.table({"uid": pa.array(["123", "-5", "x"])}), with_labels=False)
    values = batch.sparse["u"].values.tolist()
    assert values[:2] == [123, -5] and values[2] not in (0, 123)  # strings are hashed


def test_sequence_sub_feature_shares_the_zch_table():
    fs = feature_set("zch_size: 4", 'feature_configs { sequence_feature { sequence_name: "s" '
                     'sequence_length: 3 sequence_delim: ";" features { id_feature { feature_name: "u" '
                     'expression: "user:uid" embedding_dim: 4 } } } }')
    tables = fs.embedding_tables()
    assert len(tables) == 1 and tables[0].features == ("u", "s__u") and tables[0].zch


@pytest.mark.parametrize("zch, message", [
    ('zch_size: 4 threshold_filtering_func: "f"', "threshold_filtering_func is not supported"),
    ("zch_size: 0", "zch_size=0"),
], ids=["threshold-func", "size"])
def test_bad_zch_configs(zch, message):
    with pytest.raises(ConfigError, match=f"'u'.*{message}"):
        feature_set(zch)


def test_zch_and_num_buckets_together_is_an_error():
    with pytest.raises(ConfigError, match="set only one of num_buckets, zch"):
        build_feature_set(parse_pipeline_config(
            'model_dir: "m" feature_configs { id_feature { feature_name: "u" expression: "user:uid" '
            'embedding_dim: 4 num_buckets: 3 zch { zch_size: 4 } } }'))
