"""FeatureSet on the TorchEasyRec DynamicEmb Taobao config: columns, specs, batches, labels,
errors."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from hashrec.config import (
    ConfigError,
    apply_edit_config_json,
    load_pipeline_config,
    parse_pipeline_config,
)
from hashrec.features import FeatureError, build_feature_set

ROOT = Path(__file__).parents[2]
TAOBAO_CONFIG = ROOT / "tests" / "config" / "testdata" / "torcheasyrec_dynamicemb_taobao.config"
SIZES = {"user_id": 1000, "cms_segid": 98, "cms_group_id": 14, "final_gender_code": 3,
         "age_level": 8, "pvalue_level": 5, "shopping_level": 5, "occupation": 3,
         "new_user_class_level": 6, "adgroup_id": 500, "cate_id": 40, "campaign_id": 300,
         "customer": 200, "brand": 100}


def taobao_table(rows: int, seed: int = 0) -> pa.Table:
    rng = np.random.default_rng(seed)
    cols = {name: rng.integers(0, size, rows) for name, size in SIZES.items()}
    cols["price"] = rng.random(rows) * 1000
    cols["pid"] = pa.array(rng.integers(0, 20, rows).astype(str).tolist())
    lengths = rng.integers(0, 60, rows)
    for field in ("adgroup_id", "cate_id", "brand"):
        ids = rng.integers(0, SIZES[field], lengths.sum())
        rows_ids = np.split(ids, np.cumsum(lengths)[:-1]) if rows else []
        cols[f"click_50_seq__{field}"] = pa.array(["|".join(map(str, r)) for r in rows_ids],
                                                   pa.string())
    cols["clk"] = rng.integers(0, 2, rows)
    return pa.table(cols)


@pytest.fixture(scope="module")
def taobao_set():
    return build_feature_set(load_pipeline_config(TAOBAO_CONFIG))


def test_taobao_config_columns_and_specs(taobao_set):
    assert set(taobao_set.input_columns) == set(taobao_table(1).column_names)
    assert taobao_set.label_fields == ["clk"]
    tables = {t.name: t for t in taobao_set.embedding_tables()}
    dynamic = {n for n, t in tables.items() if t.is_dynamic}
    assert dynamic == {"user_id", "adgroup_id", "brand", "campaign_id", "customer", "cate_id"}
    assert {t.fusion_group for n, t in tables.items() if n in dynamic} == {"deep"}
    assert tables["adgroup_id"].features == ("adgroup_id", "click_50_seq__adgroup_id")
    assert tables["price"].num_rows == 99
    assert len(taobao_set.embedding_features()) == 19
    assert taobao_set.dense_features() == {}
    assert taobao_set.output_dim("price") == 16


def test_taobao_config_parses_a_block(taobao_set):
    table = taobao_table(64)
    batch = taobao_set.parse(table)
    assert batch.batch_size == 64
    assert batch.sparse.keys() == [f.name for f in taobao_set.embedding_features()]
    assert batch.sparse["user_id"].values.tolist() == table["user_id"].to_pylist()
    seq = batch.sparse["click_50_seq__brand"]
    assert int(seq.lengths.max()) <= 100
    first = table["click_50_seq__brand"][0].as_py()
    want = [int(x) for x in first.split("|")] if first else []
    assert seq.values[: seq.lengths[0]].tolist() == want
    assert batch.labels["clk"].tolist() == table["clk"].to_pylist()
    # record batches and chunked tables give the same result
    again = taobao_set.parse(pa.concat_tables([table.slice(0, 10), table.slice(10)]))
    assert again.sparse.values().equal(batch.sparse.values())
    assert taobao_set.parse(table.to_batches()[0]).sparse.lengths().equal(batch.sparse.lengths())


def test_empty_block(taobao_set):
    batch = taobao_set.parse(taobao_table(0))
    assert batch.batch_size == 0 and batch.sparse.values().numel() == 0


def test_without_labels(taobao_set):
    batch = taobao_set.parse(taobao_table(4).drop_columns(["clk"]), with_labels=False)
    assert batch.labels == {}


def test_label_errors(taobao_set):
    with pytest.raises(FeatureError, match="clk"):
        taobao_set.parse(taobao_table(4).drop_columns(["clk"]))
    bad = taobao_table(3).set_column(19, "clk", pa.array([1, None, 0], pa.int64()))
    with pytest.raises(FeatureError, match="label column 'clk' row 1: the label is null"):
        taobao_set.parse(bad)


def test_labels_from_text_read_as_numbers(taobao_set):
    # A CSV column without a type is text; true/false are the texts CSV readers take.
    text = taobao_table(5).set_column(19, "clk", pa.array(["1", "0", "true", "FALSE", "1.0"]))
    assert taobao_set.parse(text).labels["clk"].tolist() == [1.0, 0.0, 1.0, 0.0, 1.0]


@pytest.mark.parametrize("values", [["1", "0", "1"], [1, 0, 1]], ids=["text", "int"])
def test_dictionary_encoded_labels_and_weights_read_as_their_values(values):
    # pandas writes a categorical column as a dictionary
    config = load_pipeline_config(TAOBAO_CONFIG)
    config.data_config.sample_weight_fields.append("w")
    features = build_feature_set(config)
    weights = [str(2 * int(v)) if isinstance(v, str) else 2 * v for v in values]
    table = taobao_table(3).set_column(19, "clk", pa.array(values).dictionary_encode())
    table = table.append_column("w", pa.array(weights).dictionary_encode())
    labels = features.parse(table).labels
    assert labels["clk"].tolist() == [1.0, 0.0, 1.0]
    assert labels["w"].tolist() == [2.0, 0.0, 2.0]


@pytest.mark.parametrize("cells,row,detail", [
    (["1", "", "0"], 1, "the label is null"),
    (["0", "1", "yes"], 2, "value 'yes' is not a number"),
    (["NaN", "1", "0"], 0, r"value 'NaN' is not in \[0, 1\]"),
], ids=["empty", "word", "nan"])
def test_label_text_that_is_not_a_label_names_its_row(taobao_set, cells, row, detail):
    text = taobao_table(3).set_column(19, "clk", pa.array(cells, pa.large_string()))
    with pytest.raises(FeatureError, match=rf"^label column 'clk' row {row}: {detail}"):
        taobao_set.parse(text)


def test_unknown_feature_name(taobao_set):
    with pytest.raises(ConfigError, match="'nope' is not configured"):
        taobao_set.output_dim("nope")


def test_unsupported_feature_kind_is_named():
    config = load_pipeline_config(TAOBAO_CONFIG)
    config = apply_edit_config_json(config, {
        "feature_configs[0]": 'lookup_feature { feature_name: "kv" map: "a" key: "b" }'})
    with pytest.raises(ConfigError, match="'kv'.*lookup_feature is computed by a feature "
                                          "generation.*fg_mode FG_NONE"):
        build_feature_set(config)


@pytest.mark.parametrize("clk,row", [([1, 0, 2], 2), ([-0.5, 1, 0], 0), ([1, float("nan"), 0], 1),
                                     ([0, 1.0001, 1], 1)],
                         ids=["two", "negative", "nan", "above-one"])
def test_binary_cross_entropy_labels_are_in_0_1(taobao_set, clk, row):
    bad = taobao_table(3).set_column(19, "clk", pa.array(clk))
    with pytest.raises(FeatureError, match=rf"label column 'clk' row {row}: value .* is not in "
                                           rf"\[0, 1\]; binary_cross_entropy trains on labels "
                                           rf"in \[0, 1\] \(0/1, or a soft label") as raised:
        taobao_set.parse(bad)
    assert raised.value.row == row
    good = taobao_table(3).set_column(19, "clk", pa.array([True, False, True]))
    assert taobao_set.parse(good).labels["clk"].tolist() == [1.0, 0.0, 1.0]


def test_binary_cross_entropy_takes_soft_labels(taobao_set):
    # A rate or a teacher's probability, as TorchEasyRec's BCEWithLogitsLoss takes it.
    soft = taobao_table(4).set_column(19, "clk", pa.array([0.25, 1.0, 0.0, 0.5]))
    assert taobao_set.parse(soft).labels["clk"].tolist() == [0.25, 1.0, 0.0, 0.5]


def test_labels_are_checked_only_for_binary_cross_entropy():
    config = load_pipeline_config(TAOBAO_CONFIG)
    assert build_feature_set(config).binary_labels == {"clk"}
    config.model_config.losses[0].l2_loss.SetInParent()  # another loss: any number is a label
    regression = build_feature_set(config)
    assert regression.binary_labels == set()
    table = taobao_table(3).set_column(19, "clk", pa.array([0.0, 2.5, 7.0]))
    assert regression.parse(table).labels["clk"].tolist() == [0.0, 2.5, 7.0]


@pytest.mark.parametrize("value", [float("nan"), float("inf"), 1e39], ids=["nan", "inf",
                                                                         "float32-overflow"])
def test_a_regression_label_that_is_not_finite_names_its_row(value):
    # l2_loss reads any number, but NaN or inf made the loss NaN with no row named.
    config = load_pipeline_config(TAOBAO_CONFIG)
    config.model_config.losses[0].l2_loss.SetInParent()
    table = taobao_table(3).set_column(19, "clk", pa.array([0.5, 3.0, value]))
    with pytest.raises(FeatureError, match=r"^label column 'clk' row 2: value .* is not a "
                                           r"finite number; a label must be finite"):
        build_feature_set(config).parse(table)


def test_duplicate_feature_names():
    config = load_pipeline_config(TAOBAO_CONFIG)
    config = apply_edit_config_json(config, {
        "feature_configs[6].id_feature.feature_name": "cms_group_id"})
    with pytest.raises(ConfigError, match="'cms_group_id' is used twice"):
        build_feature_set(config)


@pytest.mark.parametrize("edit,message", [
    ({"feature_configs[6].id_feature.feature_name": "clk"}, "'clk' is a label field"),
    ({"feature_configs[6].id_feature.expression": "user:clk"}, "reads label column 'clk'"),
], ids=["name-is-label", "input-is-label"])
def test_label_names_are_reserved(edit, message):
    config = apply_edit_config_json(load_pipeline_config(TAOBAO_CONFIG), edit)
    with pytest.raises(ConfigError, match=message):
        build_feature_set(config)


LEFT_OUT_CONFIG = """
model_dir: "m"
data_config { dataset_type: ParquetDataset label_fields: "clk" }
feature_configs { id_feature { feature_name: "user_id" expression: "user:user_id"
  embedding_dim: 4 dynamicemb { max_capacity: 1000 } } }
feature_configs { id_feature { feature_name: "brand" expression: "item:brand"
  embedding_dim: 4 dynamicemb { max_capacity: 1000 } } }
feature_configs { id_feature { feature_name: "age_level" expression: "user:age_level"
  embedding_dim: 4 num_buckets: 8 } }
feature_configs { raw_feature { feature_name: "price" expression: "item:price" } }
feature_configs { id_feature { feature_name: "adgroup_id" expression: "item:adgroup_id"
  embedding_dim: 4 dynamicemb { max_capacity: 1000 } } }
feature_configs { sequence_feature { sequence_name: "click" sequence_length: 4
  sequence_delim: "|"
  features { id_feature { feature_name: "adgroup_id" expression: "item:adgroup_id"
    embedding_dim: 4 } } } }
model_config {
  feature_groups { group_name: "deep" feature_names: ["user_id"] group_type: DEEP }
  feature_groups { group_name: "seq" feature_names: ["user_id", "click__adgroup_id"]
                   group_type: SEQUENCE }
}
"""


def test_features_in_no_group_are_neither_read_nor_embedded():
    fs = build_feature_set(parse_pipeline_config(LEFT_OUT_CONFIG))
    assert list(fs.features) == ["user_id", "click__adgroup_id"]
    assert fs.left_out == ("brand", "age_level", "price", "adgroup_id")
    assert [f.name for f in fs.embedding_features()] == ["user_id", "click__adgroup_id"]
    assert fs.dense_features() == {}
    # The grouped sequence sub-feature keeps the table it shares with adgroup_id.
    tables = {t.name: t for t in fs.embedding_tables()}
    assert list(tables) == ["user_id", "adgroup_id"]
    assert tables["adgroup_id"].features == ("click__adgroup_id",)
    assert tables["adgroup_id"].is_dynamic
    assert set(fs.input_columns) == {"user_id", "click__adgroup_id", "clk"}
    batch = fs.parse(pa.table({"user_id": [3, 4], "click__adgroup_id": ["1|2", ""],
                               "clk": [0, 1]}))
    assert batch.sparse.keys() == ["user_id", "click__adgroup_id"]
    # an empty sequence is one item "0" (TorchEasyRec's default of a sequence id feature)
    assert batch.sparse["click__adgroup_id"].values.tolist() == [1, 2, 0]


def test_kept_features_are_read_without_a_group():
    fs = build_feature_set(parse_pipeline_config(LEFT_OUT_CONFIG), keep=["brand"])
    assert list(fs.features) == ["user_id", "brand", "click__adgroup_id"]
    assert fs.left_out == ("age_level", "price", "adgroup_id")
    assert [t.name for t in fs.embedding_tables()] == ["user_id", "brand", "adgroup_id"]


def test_without_feature_groups_every_feature_is_read():
    config = parse_pipeline_config(LEFT_OUT_CONFIG)
    config.ClearField("model_config")
    fs = build_feature_set(config)
    assert fs.left_out == ()
    assert list(fs.features) == ["user_id", "brand", "age_level", "price", "adgroup_id",
                                 "click__adgroup_id"]
    assert fs.embedding_tables()[-1].features == ("adgroup_id", "click__adgroup_id")


def test_features_in_no_group_are_still_checked():
    text = LEFT_OUT_CONFIG.replace(
        'feature_name: "brand" expression: "item:brand"\n  embedding_dim: 4',
        'feature_name: "brand" expression: "item:brand"\n  embedding_name: "user_id" '
        'embedding_dim: 8')
    with pytest.raises(ConfigError, match="'user_id' and 'brand' share table 'user_id' but "
                                          "have embedding_dim 4 and 8"):
        build_feature_set(parse_pipeline_config(text))


# PEPNet's towers per domain as TorchEasyRec's documentation writes them: the domain
# column is a label field and the domain group's feature reads it too.
DOMAIN_CONFIG = """
model_dir: "m"
data_config { dataset_type: ParquetDataset label_fields: ["clk", "occupation"] }
feature_configs { id_feature { feature_name: "occupation" expression: "user:occupation"
  embedding_dim: 4 num_buckets: 3 } }
feature_configs { id_feature { feature_name: "age_level" expression: "user:age_level"
  embedding_dim: 4 num_buckets: 8 } }
model_config {
  feature_groups { group_name: "all" feature_names: ["age_level", "occupation"]
                   group_type: DEEP }
  feature_groups { group_name: "domain" feature_names: "occupation" group_type: DEEP }
  pepnet { domain_input_name: "occupation" task_domain_num: 2
           task_towers { tower_name: "ctr" label_name: "clk" } }
}
"""


def _domain_table(occupation) -> pa.Table:
    rows = len(occupation)
    return pa.table({"occupation": pa.array(occupation), "age_level": [3] * rows,
                     "clk": [r % 2 for r in range(rows)]})


def test_a_domain_label_may_be_a_features_input_and_is_read_as_an_index():
    from hashrec.data.dataset import FileDataset, ReadOptions

    features = build_feature_set(parse_pipeline_config(DOMAIN_CONFIG))
    assert features.domain_label == ("occupation", 2)
    batch = features.parse(_domain_table([1, 0, 1]))
    assert batch.labels["occupation"].tolist() == [1.0, 0.0, 1.0]
    assert batch.sparse["occupation"].values.tolist() == [1, 0, 1]
    # prediction reads the column for the feature, not the label
    for with_labels in (True, False):
        assert "occupation" in FileDataset.needed_columns(
            features, ReadOptions(with_labels=with_labels))
    assert "clk" not in FileDataset.needed_columns(features, ReadOptions(with_labels=False))
    # another label read by a feature is still refused
    refused = DOMAIN_CONFIG.replace('expression: "user:age_level"', 'expression: "user:clk"')
    with pytest.raises(ConfigError, match="reads label column 'clk'"):
        build_feature_set(parse_pipeline_config(refused))


@pytest.mark.parametrize("occupation, row", [([0, 2, 1], 1), ([0, 1, -1], 2),
                                             ([0.5, 1, 0], 0)],
                         ids=["past-the-domains", "negative", "not-an-integer"])
def test_a_domain_index_out_of_range_names_its_row(occupation, row):
    # no feature reads the column here (a feature would refuse -1 first)
    text = DOMAIN_CONFIG.replace('["age_level", "occupation"]', '"age_level"') \
        .replace('feature_names: "occupation"', 'feature_names: "age_level"')
    features = build_feature_set(parse_pipeline_config(text))
    assert "occupation" not in features.features
    table = _domain_table(occupation).set_column(0, "occupation", pa.array(occupation,
                                                                           pa.float64()))
    with pytest.raises(FeatureError, match=rf"^label column 'occupation' row {row}: value .* "
                                           rf"is not a domain index in \[0, 2\); "
                                           rf"pepnet.domain_input_name reads each row's "
                                           rf"domain") as raised:
        features.parse(table)
    assert raised.value.row == row


def test_a_set_reading_other_columns_parses_them_as_its_own(taobao_set):
    table = taobao_table(8)
    moved = taobao_set.reading({"click_50_seq__brand": "brand_seq", "price": "cost"})
    renamed = table.rename_columns([{"click_50_seq__brand": "brand_seq", "price": "cost"}
                                    .get(c, c) for c in table.column_names])
    assert moved.feature_columns == [{"click_50_seq__brand": "brand_seq", "price": "cost"}
                                     .get(c, c) for c in taobao_set.feature_columns]
    before, after = taobao_set.parse(table), moved.parse(renamed)
    assert after.sparse.keys() == before.sparse.keys()
    assert after.sparse.values().equal(before.sparse.values())
    assert after.sparse.lengths().equal(before.sparse.lengths())
    # the sequence's sub-features are still parsed together; the set itself is unchanged
    assert taobao_set.features["click_50_seq__brand"].columns == ("click_50_seq__brand",)
    with pytest.raises(FeatureError, match="brand_seq"):
        moved.parse(table)
    with pytest.raises(ValueError, match="no_such_feature"):
        taobao_set.reading({"no_such_feature": "x"})
