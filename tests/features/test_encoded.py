"""Input a feature generation already wrote: fg_mode FG_NONE (encoded) and FG_BUCKETIZE."""

from __future__ import annotations

import logging
import re

import numpy as np
import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest
import xxhash

from hashrec.config import ConfigError, load_pipeline_config, parse_pipeline_config
from hashrec.data import DataError, create_dataloader
from hashrec.features import FeatureError, build_feature_set
from tests.features.test_feature_set import TAOBAO_CONFIG, taobao_table

SEP = "\x03"
NONE = "data_config { dataset_type: ParquetDataset fg_mode: FG_NONE }"
BUCKETIZE = "data_config { dataset_type: ParquetDataset fg_mode: FG_BUCKETIZE }"


def _id(options: str, name: str = "cate") -> str:
    return (f'feature_configs {{ id_feature {{ feature_name: "{name}" '
            f'expression: "item:cate_field" embedding_dim: 4 {options} }} }}')


def _sparse(batch, name):
    jt = batch.sparse[name]
    return jt.values.tolist(), jt.lengths.tolist()


def test_a_feature_reads_the_column_named_as_itself(feature_set):
    fs = feature_set(_id("num_buckets: 10"), NONE)
    assert fs.input_columns == ["cate"]
    # raw input reads the expression's field
    assert feature_set(_id("num_buckets: 10")).input_columns == ["cate_field"]


@pytest.mark.parametrize("cells", [
    [f"3{SEP}7", "", None, "9"],
    [[3, 7], [], None, [9]],
], ids=["joined-strings", "list-cells"])
def test_encoded_ids_are_taken_as_they_are(feature_set, cells):
    # hash_bucket_size: an encoded id is the bucket the generation hashed into, not hashed
    fs = feature_set(_id("hash_bucket_size: 10"), NONE)
    batch = fs.parse(pa.table({"cate": cells}))
    assert _sparse(batch, "cate") == ([3, 7, 9], [2, 0, 0, 1])


def test_an_integer_column_holds_one_id_a_row(feature_set):
    fs = feature_set(_id('vocab_list: ["a", "b"]'), NONE)
    batch = fs.parse(pa.table({"cate": pa.array([2, None, 3], pa.int64())}))
    assert _sparse(batch, "cate") == ([2, 3], [1, 0, 1])


def test_a_dynamic_table_takes_any_int64_key(feature_set):
    fs = feature_set(_id("dynamicemb { max_capacity: 1024 }"), NONE)
    big = 2**62 + 5
    batch = fs.parse(pa.table({"cate": [f"{big}{SEP}-4"]}))
    assert _sparse(batch, "cate") == ([big, -4], [2])


@pytest.mark.parametrize("cell, detail", [
    ("12", "outside the table's 10 rows"),
    ("-1", "outside the table's 10 rows"),
    ("abc", "expected an integer id"),
], ids=["past-rows", "negative", "not-an-integer"])
def test_an_encoded_id_that_is_no_row_names_its_row(feature_set, cell, detail):
    fs = feature_set(_id("hash_bucket_size: 10"), NONE)
    with pytest.raises(FeatureError, match=f"row 1.*{detail}"):
        fs.parse(pa.table({"cate": ["1", cell]}))


def test_fg_encoded_default_value_fills_missing_cells(feature_set):
    fs = feature_set(_id(f'num_buckets: 10 default_value: "5" fg_encoded_default_value: '
                         f'"0{SEP}1"'), NONE)
    batch = fs.parse(pa.table({"cate": ["4", "", None]}))
    # the encoded default, not default_value (the generation already applied that one)
    assert _sparse(batch, "cate") == ([4, 0, 1, 0, 1], [1, 2, 2])


def test_weighted_ids_keep_their_weights(feature_set):
    fs = feature_set(_id("num_buckets: 10 weighted: true"), NONE)
    batch = fs.parse(pa.table({"cate": [f"3:0.5{SEP}4:2", "7:1"]}))
    jt = batch.sparse["cate"]
    assert jt.values.tolist() == [3, 4, 7]
    assert jt.weights.tolist() == [0.5, 2.0, 1.0]


def _raw(options: str) -> str:
    return (f'feature_configs {{ raw_feature {{ feature_name: "price" expression: "item:p" '
            f'{options} }} }}')


def test_raw_values_are_not_normalized_again(feature_set):
    fs = feature_set(_raw('value_dim: 2 normalizer: "method=log10"'), NONE)
    batch = fs.parse(pa.table({"price": [f"0.5{SEP}2", f"1{SEP}-3"]}))
    assert batch.dense["price"].tolist() == [[0.5, 2.0], [1.0, -3.0]]


def test_a_missing_dense_value_asks_for_fg_encoded_default_value(feature_set):
    fs = feature_set(_raw(""), NONE)
    with pytest.raises(FeatureError, match="row 1.*set fg_encoded_default_value"):
        fs.parse(pa.table({"price": ["0.5", None]}))
    filled = feature_set(_raw('fg_encoded_default_value: "-1"'), NONE)
    assert filled.parse(pa.table({"price": [0.5, None]})).dense["price"].tolist() == \
        [[0.5], [-1.0]]


def test_bucketized_raw_cells_hold_bucket_ids(feature_set):
    fs = feature_set(_raw("boundaries: [1, 10, 100] embedding_dim: 4"), NONE)
    batch = fs.parse(pa.table({"price": ["0", "3", f"1{SEP}2"]}))
    assert _sparse(batch, "price") == ([0, 3, 1, 2], [1, 1, 2])
    with pytest.raises(FeatureError, match="row 0.*outside the table's 4 rows"):
        fs.parse(pa.table({"price": ["4"]}))


def test_a_combo_feature_reads_its_crossed_column(feature_set):
    combo = ('feature_configs { combo_feature { feature_name: "x" expression: ["user:a", '
             '"item:b"] embedding_dim: 4 hash_bucket_size: 50 } }')
    fs = feature_set(combo, NONE)
    assert fs.input_columns == ["x"]
    assert _sparse(fs.parse(pa.table({"x": [f"4{SEP}49"]})), "x") == ([4, 49], [2])


SEQUENCE = ('feature_configs { sequence_feature { sequence_name: "s" sequence_length: 3 '
            'sequence_delim: ";" features { id_feature { feature_name: "item" '
            'expression: "item:item_id" embedding_dim: 4 num_buckets: 100 } } '
            'features { raw_feature { feature_name: "t" expression: "user:ts" } } } }')


def test_sequence_sub_features_read_columns_named_as_themselves(feature_set):
    fs = feature_set(SEQUENCE, NONE)
    assert fs.input_columns == ["s__item", "s__t"]
    batch = fs.parse(pa.table({"s__item": [f"5{SEP};7;8;9", "", "3"],
                               "s__t": ["1;2;3;4", "", "0.5"]}))
    # items split on the sequence's delimiter, an item's values on the separator
    assert _sparse(batch, "s__item") == ([5, 7, 8, 3], [3, 0, 1])
    assert batch.sequence_dense["s__t"][:, :, 0].tolist() == [[1, 2, 3], [0, 0, 0],
                                                              [0.5, 0, 0]]


@pytest.mark.parametrize("mode", [NONE, BUCKETIZE], ids=["none", "bucketize"])
@pytest.mark.parametrize("cells, item", [
    (["7", f"5{SEP}6;7"], f"{f'5{SEP}6'!r} holds 2 values (separated by {SEP!r})"),
    ([[[7]], [[5, 6], [7]]], "[5, 6] holds 2 values;"),
], ids=["joined-strings", "list-of-lists"])
def test_a_sequence_item_of_several_values_is_refused(feature_set, mode, cells, item):
    # before, the item read as its first value: a generation of value_dim 0 wrote values
    # that TorchEasyRec pools per item, which the feature reads with value_dim 0 only
    fs = feature_set(SEQUENCE, mode)
    with pytest.raises(FeatureError, match=f"'s__item'.*row 1: item {re.escape(item)}.*"
                                           f"set value_dim 0 on the feature"):
        fs.parse(pa.table({"s__item": cells, "s__t": ["1", "1;2"]}))


def test_list_of_list_items_of_one_value_read_as_that_value(feature_set):
    fs = feature_set(SEQUENCE, NONE)
    batch = fs.parse(pa.table({"s__item": [[[5], [None, 7]], [], [[3]]],
                               "s__t": [[1.0, 2.0], [], [0.5]]}))
    assert _sparse(batch, "s__item") == ([5, 7, 3], [2, 0, 1])


def test_a_bucketized_raw_sequence_item_of_several_values_is_refused(feature_set):
    seq = ('feature_configs { sequence_raw_feature { feature_name: "ts" expression: '
           '"user:ts" sequence_length: 4 boundaries: [1, 10] embedding_dim: 4 } }')
    fs = feature_set(seq, NONE)
    assert _sparse(fs.parse(pa.table({"ts": ["0;2"]})), "ts") == ([0, 2], [2])
    with pytest.raises(FeatureError, match=f"'ts'.*row 0: item "
                                           f"{re.escape(repr(f'1{SEP}2'))} holds 2 values"):
        fs.parse(pa.table({"ts": [f"1{SEP}2;0"]}))


def test_raw_input_reads_a_sequence_item_as_its_first_value(feature_set):
    # fg_mode FG_DAG: value_dim 1 keeps an item's first value, as TorchEasyRec's
    # generation does
    fs = feature_set(SEQUENCE)
    batch = fs.parse(pa.table({"s__item_id": ["5\x1d6;7"], "s__ts": ["1;2"]}))
    assert batch.sparse["s__item"].lengths.tolist() == [2]


def test_only_raw_input_says_missing_items_read_as_0(feature_set, caplog):
    with caplog.at_level(logging.INFO, logger="hashrec.features"):
        feature_set(SEQUENCE, NONE)
        assert "reads missing items" not in caplog.text  # encoded: none, or its default
        feature_set(SEQUENCE)
    assert "feature 's__item': a sequence id feature without default_value" in caplog.text


def test_bucketize_mode_bucketizes_the_generated_tokens(feature_set):
    fs = feature_set(_id("hash_bucket_size: 97"), BUCKETIZE)
    batch = fs.parse(pa.table({"cate": [f"a{SEP}b", None]}))
    want = [xxhash.xxh64_intdigest(t.encode()) % 97 for t in ("a", "b")]
    assert _sparse(batch, "cate") == (want, [2, 0])
    raw = feature_set(_raw('normalizer: "method=log10" boundaries: [1, 10]'
                           ' embedding_dim: 4'), BUCKETIZE)
    # the generation normalized the values: 5 is cut at the boundaries as it is
    assert _sparse(raw.parse(pa.table({"price": ["5", "0.5"]})), "price") == ([1, 0], [1, 1])


def test_encoding_the_taobao_ids_reads_back_the_same_batch():
    """A raw block's ids written as list columns named after the features, as a feature
    generation encodes them, read back under FG_NONE to the same batch."""
    config = load_pipeline_config(TAOBAO_CONFIG)
    raw_set = build_feature_set(config)
    table = taobao_table(200, seed=3)
    raw = raw_set.parse(table)
    encoded_columns = {}
    for name in raw.sparse.keys():
        jt = raw.sparse[name]
        offsets = np.concatenate([[0], np.cumsum(jt.lengths.numpy())])
        encoded_columns[name] = pa.ListArray.from_arrays(
            pa.array(offsets, pa.int32()), pa.array(jt.values.numpy()))
    encoded_columns["clk"] = table["clk"]
    config.data_config.fg_mode = 1  # FG_NONE
    again = build_feature_set(config).parse(pa.table(encoded_columns))
    assert again.sparse.keys() == raw.sparse.keys()
    assert again.sparse.values().equal(raw.sparse.values())
    assert again.sparse.lengths().equal(raw.sparse.lengths())
    assert again.labels["clk"].equal(raw.labels["clk"])


@pytest.mark.parametrize("dataset", ["ParquetDataset", "CsvDataset"])
def test_a_file_without_the_feature_named_column_says_why_it_is_read(feature_set, tmp_path,
                                                                      dataset):
    # a file written for raw input has the expression's field, not the feature's name
    table = pa.table({"cate_field": ["1"], "clk": [0]})
    path = tmp_path / f"raw.{'csv' if dataset == 'CsvDataset' else 'parquet'}"
    (pacsv.write_csv if dataset == "CsvDataset" else pq.write_table)(table, str(path))
    data = (f"data_config {{ dataset_type: {dataset} with_header: true fg_mode: FG_NONE "
            f"label_fields: 'clk' }}")
    fs = feature_set(_id("num_buckets: 10"), data)
    config = parse_pipeline_config(f'model_dir: "m"\n{data}')
    with pytest.raises(DataError, match="column 'cate' is missing .*fg_mode is FG_NONE, so "
                                        "feature 'cate' reads the column named as itself.*"
                                        "not the column raw input would read \\('cate_field'\\)"):
        create_dataloader(config.data_config, fs, str(path), "eval")
    assert feature_set(_id("num_buckets: 10")).column_notes == {}  # raw input


@pytest.mark.parametrize("features, detail", [
    (_id('num_buckets: 10 fg_encoded_default_value: "11"'),
     "'cate': fg_encoded_default_value '11' .*id outside the table's 10 rows"),
    (_id('num_buckets: 10 fg_encoded_default_value: "abc"'),
     "'cate': fg_encoded_default_value 'abc' .*expected an integer id"),
    (_raw('value_dim: 2 fg_encoded_default_value: "0"'),
     "'price': fg_encoded_default_value '0' .*expected value_dim=2"),
    (SEQUENCE.replace("num_buckets: 100", 'num_buckets: 100 fg_encoded_default_value: "100"'),
     "'s__item': fg_encoded_default_value '100' .*id outside the table's 100 rows"),
], ids=["past-rows", "not-an-integer", "too-few-values", "sequence-past-rows"])
def test_a_default_no_cell_could_hold_is_a_config_error(feature_set, features, detail):
    # before, the first missing cell failed, naming a row whose cell is empty
    with pytest.raises(ConfigError, match=f"^feature {detail}"):
        feature_set(features, NONE)


# TorchEasyRec's examples of encoded input leave expression out (deepfm_criteo,
# dbmtl_taobao_seq): before, such a config did not parse (expression was required).
NO_EXPRESSIONS = (
    'feature_configs { id_feature { feature_name: "cate" embedding_dim: 4 '
    'num_buckets: 10 } }\n'
    'feature_configs { raw_feature { feature_name: "price" } }\n'
    'feature_configs { combo_feature { feature_name: "x" embedding_dim: 4 '
    'hash_bucket_size: 50 } }\n'
    'feature_configs { sequence_id_feature { feature_name: "hist" sequence_length: 2 '
    'embedding_dim: 4 num_buckets: 10 } }\n'
    'feature_configs { sequence_feature { sequence_name: "s" sequence_length: 2 '
    'sequence_delim: ";" features { id_feature { feature_name: "cate" embedding_dim: 4 } } '
    'features { raw_feature { feature_name: "t" } } } }')


@pytest.mark.parametrize("mode", [NONE, BUCKETIZE], ids=["none", "bucketize"])
def test_encoded_input_needs_no_expression(feature_set, mode):
    fs = feature_set(NO_EXPRESSIONS, mode)
    assert fs.input_columns == ["cate", "price", "x", "hist", "s__cate", "s__t"]
    # the sequence's cate, without a bucketization of its own, shares the feature cate's
    assert fs.features["s__cate"].table.name == fs.features["cate"].table.name
    # no column of raw input to name beside the feature's own
    assert "raw input would read" not in " ".join(fs.column_notes.values())
    batch = fs.parse(pa.table({"cate": ["3"], "price": ["0.5"], "x": ["4"], "hist": ["1;2"],
                               "s__cate": ["5;6"], "s__t": ["1;2"]}))
    assert _sparse(batch, "s__cate") == ([5, 6], [2])
    assert batch.dense["price"].tolist() == [[0.5]]


def test_raw_input_refuses_a_feature_without_expression(feature_set):
    with pytest.raises(ConfigError) as err:
        feature_set(NO_EXPRESSIONS, NONE.replace("FG_NONE", "FG_DAG"))
    for name in ("'cate'", "'price'", "'x'", "'hist'", "'s__cate'", "'s__t'"):
        assert f"feature {name} (feature_configs[" in str(err.value)
    assert ("'cate' (feature_configs[0]) sets no expression, which names the input column "
            "that raw input (data_config.fg_mode is FG_DAG) reads it from; add one, e.g. "
            "expression: \"user:cate\", or read input a feature generation encoded, which "
            "holds the feature in the column named after it, with data_config.fg_mode "
            "FG_NONE") in str(err.value)
