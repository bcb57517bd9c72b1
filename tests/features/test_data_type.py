"""data_type: a feature's FP32 / FP16 / BF16 becomes the dtype its table stores rows in."""

from __future__ import annotations

import pytest
import torch

from hashrec.config import ConfigError
from hashrec.embedding import EmbeddingCollection
from hashrec.table import SparseAdam


def _id(name: str, options: str) -> str:
    return (f'feature_configs {{ id_feature {{ feature_name: "{name}" expression: "user:{name}" '
            f'embedding_dim: 4 {options} }} }}\n')


DYNAMIC = "dynamicemb { max_capacity: 64 }"


@pytest.mark.parametrize("data_type, dtype", [
    ("", torch.float32), ('data_type: "FP32"', torch.float32),
    ('data_type: "FP16"', torch.float16), ('data_type: "BF16"', torch.bfloat16),
], ids=["unset", "fp32", "fp16", "bf16"])
def test_every_table_kind_stores_its_rows_in_the_data_type(feature_set, data_type, dtype):
    fs = feature_set(
        _id("dyn", f"{DYNAMIC} {data_type}") + _id("dense", f"num_buckets: 9 {data_type}")
        + _id("hashed", f"hash_bucket_size: 9 {data_type}")
        + _id("vocab", f'vocab_list: ["a", "b"] {data_type}')
        + _id("zch", f"zch {{ zch_size: 16 lfu {{}} }} {data_type}")
        + 'feature_configs { raw_feature { feature_name: "p" expression: "item:p" '
          f'embedding_dim: 4 boundaries: [0.5, 1.5] {data_type} }} }}\n'
        + 'feature_configs { combo_feature { feature_name: "c" expression: ["user:a", '
          f'"user:b"] embedding_dim: 4 hash_bucket_size: 9 {data_type} }} }}')
    tables = {t.name: t for t in fs.embedding_tables()}
    assert tables["dyn"].dynamic.dtype == dtype and tables["dyn"].dtype is None
    assert {name: t.row_dtype for name, t in tables.items()} == dict.fromkeys(tables, dtype)
    collection = EmbeddingCollection(fs.embedding_tables(), fs.embedding_features(),
                                     SparseAdam())
    assert collection.dynamic_tables()["dyn"].storage.values.dtype == dtype
    assert {name: t.rows.dtype for name, t in collection.dense_tables.items()} == \
        dict.fromkeys(collection.dense_tables, dtype)


@pytest.mark.parametrize("value", ["FP64", "fp16", "INT8", ""])
def test_other_values_are_refused_naming_the_feature(feature_set, value):
    with pytest.raises(ConfigError, match=f"feature 'a': data_type '{value}' is not supported; "
                                          f"allowed: FP32, FP16, BF16"):
        feature_set(_id("a", f'{DYNAMIC} data_type: "{value}"'))


def test_a_raw_feature_without_embedding_refuses_half_data_types(feature_set):
    with pytest.raises(ConfigError, match="feature 'p': data_type FP16 .* raw_feature without "
                                          "boundaries has none"):
        feature_set('feature_configs { raw_feature { feature_name: "p" expression: "item:p" '
                    'data_type: "FP16" } }')
    fs = feature_set('feature_configs { raw_feature { feature_name: "p" expression: "item:p" '
                     'data_type: "FP32" } }')
    assert fs.embedding_tables() == []


@pytest.mark.parametrize("table", [DYNAMIC, "num_buckets: 9"], ids=["dynamic", "dense"])
def test_features_sharing_a_table_agree_on_it(feature_set, table):
    shared = f'{table} embedding_name: "t"'
    fs = feature_set(_id("a", shared + ' data_type: "BF16"')
                     + _id("b", shared + ' data_type: "BF16"'))
    assert fs.embedding_tables()[0].row_dtype == torch.bfloat16
    message = "features 'a' and 'b' share table 't' but have data_type BF16 and FP32"
    with pytest.raises(ConfigError, match=message):
        feature_set(_id("a", shared + ' data_type: "BF16"') + _id("b", shared))
    with pytest.raises(ConfigError, match="data_type FP16 and BF16"):
        feature_set(_id("a", shared + ' data_type: "FP16"')
                    + _id("b", shared + ' data_type: "BF16"'))


def _sequence(sub_options: str) -> str:
    return ('feature_configs { sequence_feature { sequence_name: "s" sequence_length: 5 '
            'sequence_delim: ";" features { id_feature { feature_name: "item" '
            f'expression: "item:item" embedding_dim: 4 {sub_options} }} }} }} }}\n')


def test_sequence_sub_features_take_or_share_the_owner_data_type(feature_set):
    owner = _id("item", f'{DYNAMIC} data_type: "FP16"').replace("user:item", "item:item")
    fs = feature_set(owner + _sequence(""))
    (table,) = fs.embedding_tables()
    assert table.features == ("item", "s__item") and table.row_dtype == torch.float16
    fs = feature_set(owner + _sequence('embedding_name: "t2"'))
    assert {t.name: t.row_dtype for t in fs.embedding_tables()} == {
        "item": torch.float16, "t2": torch.float16}  # drawn and stored like the owner's
    fs = feature_set(owner + _sequence('embedding_name: "t2" data_type: "BF16"'))
    assert {t.name: t.row_dtype for t in fs.embedding_tables()}["t2"] == torch.bfloat16
    fs = feature_set(owner + _sequence('data_type: "FP16"'))
    assert fs.embedding_tables()[0].row_dtype == torch.float16
    with pytest.raises(ConfigError, match="share table 'item' but have data_type FP16 and FP32"):
        feature_set(owner + _sequence('data_type: "FP32"'))


def test_tables_of_a_group_fuse_only_with_the_same_data_type(feature_set):
    model = ('model_config { feature_groups { group_name: "deep" feature_names: '
             '["a", "b", "c", "d", "e"] group_type: DEEP } }')
    fs = feature_set(_id("a", f'{DYNAMIC} data_type: "FP16"')
                     + _id("b", f'{DYNAMIC} data_type: "FP16"') + _id("c", DYNAMIC)
                     + _id("d", f'{DYNAMIC} data_type: "BF16"') + _id("e", DYNAMIC), model)
    collection = EmbeddingCollection(fs.embedding_tables(), fs.embedding_features(),
                                     SparseAdam())
    storages = {name: (table.options.dtype, table.options.max_capacity)
                for name, table in collection.dynamic_tables().items()}
    assert storages == {"deep_0": (torch.float16, 128), "deep_1": (torch.float32, 128),
                        "d": (torch.bfloat16, 64)}
    assert {t: s for t, (s, _) in collection.table_locations().items()} == {
        "a": "deep_0", "b": "deep_0", "c": "deep_1", "e": "deep_1", "d": "d"}
