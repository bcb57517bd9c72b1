"""WIDE feature groups: the wide tables, their specs and the tables left unread."""

from __future__ import annotations

import pytest

from hashrec.config import ConfigError
from hashrec.features.wide import wide_name
from hashrec.table.options import InitializerMode

FEATURES = """
feature_configs { id_feature { feature_name: "user_id" expression: "user:user_id"
  embedding_dim: 8 dynamicemb { max_capacity: 1024 } } }
feature_configs { id_feature { feature_name: "item_id" expression: "item:item_id"
  embedding_dim: 8 dynamicemb { max_capacity: 2048 } } }
feature_configs { id_feature { feature_name: "cate_id" expression: "item:cate_id"
  embedding_dim: 8 num_buckets: 50 } }
feature_configs { id_feature { feature_name: "brand" expression: "item:brand"
  embedding_dim: 8 num_buckets: 50 embedding_name: "shared" weighted: true } }
feature_configs { id_feature { feature_name: "shop" expression: "item:shop"
  embedding_dim: 8 num_buckets: 50 embedding_name: "shared" pooling: "mean" } }
feature_configs { raw_feature { feature_name: "price" expression: "item:price" } }
feature_configs { sequence_feature { sequence_name: "clicks" sequence_length: 5
  sequence_delim: "|" features { id_feature { feature_name: "item_id"
  expression: "item:item_id" embedding_dim: 8 } } } }
"""


def _model(wide: str, deep: str, settings: str = "") -> str:
    return (f'model_config {{\n'
            f'  feature_groups {{ group_name: "wide" group_type: WIDE feature_names: {wide} }}\n'
            f'  feature_groups {{ group_name: "deep" group_type: DEEP feature_names: {deep} }}\n'
            f'  wide_and_deep {{ deep {{ hidden_units: [4] }} {settings} }}\n}}')


def _tables(fs) -> dict:
    return {t.name: t for t in fs.embedding_tables()}


def test_wide_tables_copy_their_tables_at_the_wide_dimension(feature_set):
    fs = feature_set(FEATURES, _model('["user_id", "cate_id", "brand", "shop"]',
                                      '["user_id", "item_id", "cate_id", "shop", "price"]'))
    tables = _tables(fs)
    assert list(tables) == ["user_id", "item_id", "cate_id", "shared", "user_id_wide",
                            "cate_id_wide", "shared_wide"]
    assert tables["shared"].features == ("shop",)  # brand is only in the WIDE group
    user = tables["user_id_wide"]
    assert (user.dim, user.dynamic.dim, user.dynamic.max_capacity) == (4, 4, 1024)
    assert user.dynamic.name == "user_id_wide" and user.fusion_group == "wide"
    assert tables["user_id"].fusion_group == "deep" and tables["user_id"].dim == 8
    assert (tables["cate_id_wide"].num_rows, tables["cate_id_wide"].dim) == (50, 4)
    # features sharing a table share its wide table
    assert tables["shared_wide"].features == ("brand@wide", "shop@wide")
    wide = {f.name: f for f in fs.embedding_features() if f.key}
    assert list(wide) == [wide_name(n) for n in ("user_id", "cate_id", "brand", "shop")]
    assert (wide["brand@wide"].key, wide["brand@wide"].table) == ("brand", "shared_wide")
    assert wide["brand@wide"].weighted and wide["shop@wide"].pooling == "mean"
    assert fs.output_dim("user_id@wide") == 4 and fs.output_dim("user_id") == 8


def test_features_only_in_wide_groups_are_not_looked_up_in_their_own_table(feature_set):
    fs = feature_set(FEATURES, _model('["user_id", "item_id", "brand"]',
                                      '["user_id", "shop"]'))
    tables = _tables(fs)
    # brand's shared table is still read by shop; item_id's own one by nothing read (the
    # clicks sequence sharing it is in no group), nor cate_id's (in no group)
    assert tables["shared"].features == ("shop",)
    assert "item_id" not in tables and "cate_id" not in tables
    own = [f.name for f in fs.embedding_features() if not f.key]
    assert "item_id" not in own and "brand" not in own and "user_id" in own
    assert "item_id" in fs.features  # the input is still parsed for the wide table
    only_wide = feature_set(FEATURES, _model('["cate_id"]', '["user_id"]'))
    assert "cate_id" not in _tables(only_wide) and "cate_id_wide" in _tables(only_wide)


def test_a_feature_in_two_wide_groups_has_one_wide_embedding(feature_set):
    model = _model('["user_id"]', '["item_id"]').replace(
        'feature_groups { group_name: "deep"',
        'feature_groups { group_name: "wide2" group_type: WIDE feature_names: ["user_id"] }\n'
        '  feature_groups { group_name: "deep"')
    fs = feature_set(FEATURES, model)
    assert [f.name for f in fs.embedding_features() if f.key] == ["user_id@wide"]
    assert _tables(fs)["user_id_wide"].fusion_group is None


def test_names_a_wide_group_cannot_embed_are_left_to_the_model(feature_set):
    fs = feature_set(FEATURES, _model('["price", "clicks__item_id", "ghost"]', '["user_id"]'))
    assert [f.name for f in fs.embedding_features() if f.key] == []


def test_default_dimension_and_initializer(feature_set):
    fs = feature_set(FEATURES, _model('["user_id", "cate_id"]', '["user_id"]'))
    tables = _tables(fs)
    assert tables["user_id_wide"].dim == 4
    assert tables["user_id_wide"].dynamic.initializer == tables["user_id"].dynamic.initializer
    assert tables["cate_id_wide"].initializer is None
    fs = feature_set(FEATURES, _model(
        '["user_id", "cate_id"]', '["item_id"]',
        'wide_embedding_dim: 1 wide_init_fn: "nn.init.uniform_,a=-0.01,b=0.01"'))
    tables = _tables(fs)
    for init in (tables["user_id_wide"].dynamic.initializer,
                 tables["cate_id_wide"].initializer):
        assert (init.mode, init.lower, init.upper) == (InitializerMode.UNIFORM, -0.01, 0.01)
    assert tables["user_id_wide"].dim == 1


@pytest.mark.parametrize("features, model, message", [
    (FEATURES, _model('["user_id"]', '["item_id"]', "wide_embedding_dim: 0"),
     "wide_and_deep.wide_embedding_dim is 0; allowed: 1 or more"),
    (FEATURES, _model('["user_id"]', '["item_id"]', 'wide_init_fn: "nn.init.xavier_normal_"'),
     "wide_and_deep.wide_init_fn 'nn.init.xavier_normal_': 'nn.init.xavier_normal_' is not"),
    (FEATURES.replace('embedding_name: "shared" pooling', 'embedding_name: "cate_id_wide" '
                      'pooling'), _model('["cate_id"]', '["shop"]'),
     "wide table 'cate_id_wide' has the name of a configured table"),
    (FEATURES.replace('"price"', '"cate_id@wide"'), _model('["cate_id"]', '["user_id"]'),
     "'cate_id@wide' is the name of the wide embedding of feature 'cate_id'"),
], ids=["dim", "init-fn", "table-name", "feature-name"])
def test_wide_setting_errors(feature_set, features, model, message):
    with pytest.raises(ConfigError, match=message):
        feature_set(features, model)
