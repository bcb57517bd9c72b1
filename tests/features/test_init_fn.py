"""init_fn: a feature's torch.nn.init text becomes its table's initializer."""

from __future__ import annotations

import pytest
import torch

from hashrec.config import ConfigError
from hashrec.embedding.dense_table import DenseTable
from hashrec.features.init_fn import parse_init_fn
from hashrec.table import SparseSGD
from hashrec.table.options import InitializerArgs, InitializerMode


def _id(name: str, options: str) -> str:
    return (f'feature_configs {{ id_feature {{ feature_name: "{name}" expression: "user:{name}" '
            f'embedding_dim: 4 {options} }} }}\n')


@pytest.mark.parametrize("text, expected", [
    ("nn.init.uniform_,a=-0.01,b=0.01", InitializerArgs("UNIFORM", lower=-0.01, upper=0.01)),
    ("torch.nn.init.uniform_", InitializerArgs("UNIFORM", lower=0.0, upper=1.0)),
    ("nn.init.normal_, std=0.05", InitializerArgs("NORMAL", mean=0.0, std_dev=0.05)),
    ("normal_,mean=1,std=2", InitializerArgs("NORMAL", mean=1.0, std_dev=2.0)),
    ("nn.init.trunc_normal_,std=0.1,a=-0.2,b=0.2",
     InitializerArgs("TRUNCATED_NORMAL", std_dev=0.1)),
    ("nn.init.trunc_normal_", InitializerArgs("TRUNCATED_NORMAL", std_dev=1.0)),
    # torch's default cut at -+2 lies 100 std out: no draw is cut
    ("nn.init.trunc_normal_,std=0.02", InitializerArgs("NORMAL", std_dev=0.02)),
    # any other cut: the truncated normal cut at a and b
    ("nn.init.trunc_normal_,std=0.1,a=-0.3,b=0.05",
     InitializerArgs("TRUNCATED_NORMAL", std_dev=0.1, lower=-0.3, upper=0.05)),
    ("nn.init.constant_,val=0.5", InitializerArgs("CONSTANT", value=0.5)),
    ("nn.init.zeros_", InitializerArgs("CONSTANT", value=0.0)),
    ("nn.init.ones_", InitializerArgs("CONSTANT", value=1.0)),
], ids=["uniform", "uniform-defaults", "normal", "normal-mean", "trunc-normal",
        "trunc-normal-defaults", "trunc-normal-far-cut", "trunc-normal-cut", "constant",
        "zeros", "ones"])
def test_supported_functions(text, expected):
    assert parse_init_fn(text, "feature 'f': init_fn") == expected


@pytest.mark.parametrize("text, message", [
    ("nn.init.xavier_uniform_", "'nn.init.xavier_uniform_' is not supported"),
    ("nn.init.uniform_,-0.1,0.1", "'-0.1' is not a keyword argument of uniform_"),
    ("nn.init.normal_,sd=0.1", "'sd=0.1' is not a keyword argument"),
    ("nn.init.normal_,std=big", "std='big' is not a number"),
    ("nn.init.normal_,std=nan", "std must be finite"),
    ("nn.init.constant_", "constant_ needs val=..."),
    ("nn.init.uniform_,a=1,b=-1", "lower"),
    ("nn.init.trunc_normal_,std=0.1,a=0.3,b=-0.3", "a=0.3 must be below b=-0.3"),
], ids=["xavier", "positional", "keyword", "number", "nan", "missing", "bounds", "cut"])
def test_refusals_name_the_feature(text, message):
    with pytest.raises(ConfigError, match=f"feature 'f': init_fn .*{message}"):
        parse_init_fn(text, "feature 'f': init_fn")


def test_dense_tables_start_from_the_init_fn(feature_set):
    fs = feature_set(_id("a", 'num_buckets: 500 init_fn: "nn.init.uniform_,a=0.5,b=0.75"')
                     + _id("b", 'num_buckets: 9 init_fn: "nn.init.zeros_"')
                     + _id("c", "num_buckets: 9"))
    a, b, c = fs.embedding_tables()
    assert c.initializer is None
    table = DenseTable(a.name, a.num_rows, a.dim, SparseSGD(), a.initializer)
    assert float(table.rows.min()) >= 0.5 and float(table.rows.max()) <= 0.75
    assert torch.all(DenseTable(b.name, 9, 4, SparseSGD(), b.initializer).rows == 0)


def test_dynamic_tables_start_from_the_init_fn(feature_set):
    fs = feature_set(_id("a", 'dynamicemb { max_capacity: 64 } init_fn: "nn.init.normal_,std=0.2"'))
    (table,) = fs.embedding_tables()
    assert table.dynamic.initializer == InitializerArgs("NORMAL", std_dev=0.2)
    with pytest.raises(ConfigError, match="init_fn and dynamicemb.initializer_args both"):
        feature_set(_id("a", 'dynamicemb { max_capacity: 64 initializer_args { mode: "NORMAL" '
                             '} } init_fn: "nn.init.zeros_"'))


def test_features_sharing_a_table_agree_on_it(feature_set):
    shared = 'num_buckets: 9 embedding_name: "t"'
    fs = feature_set(_id("a", shared + ' init_fn: "nn.init.ones_"') + _id("b", shared))
    assert fs.embedding_tables()[0].initializer.mode is InitializerMode.CONSTANT
    with pytest.raises(ConfigError, match="share table 't' with different init_fn"):
        feature_set(_id("a", shared + ' init_fn: "nn.init.ones_"')
                    + _id("b", shared + ' init_fn: "nn.init.zeros_"'))


def test_a_raw_feature_without_embedding_refuses_init_fn(feature_set):
    with pytest.raises(ConfigError, match="raw_feature without boundaries has none"):
        feature_set('feature_configs { raw_feature { feature_name: "p" expression: "item:p" '
                    'init_fn: "nn.init.zeros_" } }')


def _sequence(sub_options: str) -> str:
    return ('feature_configs { sequence_feature { sequence_name: "s" sequence_length: 5 sequence_delim: ";" '
            'features { id_feature { feature_name: "item" expression: "item:item" '
            f'embedding_dim: 4 {sub_options} }} }} }} }}\n')


def test_sequence_sub_features_take_or_share_the_owner_init_fn(feature_set):
    owner = _id("item", 'num_buckets: 9 init_fn: "nn.init.ones_"')
    fs = feature_set(owner + _sequence('embedding_name: "t2"'))
    tables = {t.name: t for t in fs.embedding_tables()}
    assert tables["t2"].initializer == tables["item"].initializer  # drawn like the owner's
    with pytest.raises(ConfigError, match="share table 'item' with different init_fn"):
        feature_set(owner + _sequence('init_fn: "nn.init.zeros_"'))
