"""Kinds only a feature generation computes, read from its output (FG_NONE, FG_BUCKETIZE)."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import xxhash

from hashrec.config import ConfigError, parse_pipeline_config, validate
from hashrec.data import create_dataloader
from hashrec.features import FeatureError, generated

SEP = "\x03"
NONE = "data_config { dataset_type: ParquetDataset fg_mode: FG_NONE label_fields: 'clk' }"
BUCKETIZE = "data_config { dataset_type: ParquetDataset fg_mode: FG_BUCKETIZE }"

LOOKUP_DENSE = ('feature_configs { lookup_feature { feature_name: "ctr" map: "item:m" '
                'key: "user:k" value_dim: 2 normalizer: "method=log10" } }')
LOOKUP_IDS = ('feature_configs { lookup_feature { feature_name: "kv" map: "item:m" '
              'key: "user:k" embedding_dim: 4 num_buckets: 10 } }')
MATCH_VOCAB = ('feature_configs { match_feature { feature_name: "mt" nested_map: "user:n" '
               'pkey: "item:c" skey: "item:b" embedding_dim: 4 vocab_list: ["a", "b"] } }')
EXPR_BUCKETS = ('feature_configs { expr_feature { feature_name: "ex" expression: "a/b" '
                'variables: ["item:a", "item:b"] embedding_dim: 4 boundaries: [0.5, 1] } }')
EXPR_DENSE = ('feature_configs { expr_feature { feature_name: "ratio" expression: "a/b" '
              'variables: ["item:a", "item:b"] fg_encoded_default_value: "-1" } }')
CUSTOM_KEYS = ('feature_configs { custom_feature { feature_name: "cu" operator_name: "op" '
               'embedding_dim: 4 dynamicemb { max_capacity: 64 } } }')
BOOL_MASK = ('feature_configs { bool_mask_feature { feature_name: "bm" expression: ["a", "b"] '
             'embedding_dim: 4 hash_bucket_size: 7 } }')
ALL = "\n".join([LOOKUP_DENSE, LOOKUP_IDS, MATCH_VOCAB, EXPR_BUCKETS, EXPR_DENSE, CUSTOM_KEYS,
                 BOOL_MASK])


def _sparse(batch, name):
    jt = batch.sparse[name]
    return jt.values.tolist(), jt.lengths.tolist()


def _table():
    return pa.table({
        "ctr": [f"0.5{SEP}2", "1;2".replace(";", SEP)],
        "kv": [[3, 9], []],
        "mt": ["2", f"0{SEP}3"],
        "ex": pa.array([2, 0], pa.int64()),
        "ratio": [0.25, None],
        "cu": [f"{2**40}", "-3"],
        "bm": ["6", ""],
        "clk": [1, 0],
    })


def test_the_kinds_the_config_accepts_are_those_built():
    assert validate.GENERATED_KINDS == generated.GENERATED_KINDS


def test_a_hand_made_parquet_file_reads_as_the_configs_say(feature_set, tmp_path):
    # before, each of these kinds was refused, encoded input or not
    fs = feature_set(ALL, NONE)
    assert fs.input_columns == ["ctr", "kv", "mt", "ex", "ratio", "cu", "bm", "clk"]
    pq.write_table(_table(), tmp_path / "part.parquet")
    config = parse_pipeline_config(f'model_dir: "m"\n{NONE}')
    batch = next(iter(create_dataloader(config.data_config, fs, str(tmp_path), "eval",
                                        num_workers=0)))
    # dense values as the generation wrote them (not normalized again)
    assert batch.dense["ctr"].tolist() == [[0.5, 2.0], [1.0, 2.0]]
    assert batch.dense["ratio"].tolist() == [[0.25], [-1.0]]  # fg_encoded_default_value
    # ids taken as they are: rows of the tables, keys of a dynamic one
    assert _sparse(batch, "kv") == ([3, 9], [2, 0])
    assert _sparse(batch, "mt") == ([2, 0, 3], [1, 2])
    assert _sparse(batch, "ex") == ([2, 0], [1, 1])
    assert _sparse(batch, "cu") == ([2**40, -3], [1, 1])
    assert _sparse(batch, "bm") == ([6], [1, 0])
    assert fs.output_dim("ctr") == 2 and fs.output_dim("kv") == 4
    tables = {t.name: t.num_rows for t in fs.embedding_tables()}
    # a vocab_list's rows: its entries after the default_value's and the unknown ids'
    assert tables == {"kv": 10, "mt": 4, "ex": 3, "cu": None, "bm": 7}


@pytest.mark.parametrize("column, cell, detail", [
    ("kv", [10], "outside the table's 10 rows"),
    ("ex", 3, "outside the table's 3 rows"),
    ("mt", "x", "expected an integer id"),
], ids=["past-num-buckets", "past-boundaries", "not-an-integer"])
def test_an_id_that_is_no_row_names_its_row(feature_set, column, cell, detail):
    fs = feature_set(ALL, NONE)
    table = _table()
    cells = table[column].to_pylist()
    cells[1] = cell
    table = table.set_column(table.schema.get_field_index(column), column, pa.array(cells))
    with pytest.raises(FeatureError, match=f"feature '{column}'.*row 1.*{detail}"):
        fs.parse(table)


def test_bucketize_mode_bucketizes_the_generated_values(feature_set):
    fs = feature_set("\n".join([MATCH_VOCAB, EXPR_BUCKETS, BOOL_MASK]), BUCKETIZE)
    batch = fs.parse(pa.table({"mt": ["b", None], "ex": [0.7, 3.0], "bm": ["x", "y"]}),
                     with_labels=False)
    assert _sparse(batch, "mt") == ([3, 0], [1, 1])  # "b" is entry 1; missing: default "0"
    assert _sparse(batch, "ex") == ([1, 2], [1, 1])
    want = [xxhash.xxh64_intdigest(t.encode()) % 7 for t in ("x", "y")]
    assert _sparse(batch, "bm") == (want, [1, 1])


@pytest.mark.parametrize("features, detail", [
    (LOOKUP_IDS.replace("num_buckets: 10", "num_buckets: 10 boundaries: [1]"),
     "'kv': set either boundaries or num_buckets"),
    (BOOL_MASK.replace("hash_bucket_size: 7", ""),
     "'bm': set one of hash_bucket_size"),
    (LOOKUP_DENSE.replace("value_dim: 2", 'value_dim: 2 init_fn: "nn.init.zeros_"'),
     "'ctr': init_fn initializes an embedding"),
    (EXPR_DENSE.replace('"-1"', '"a"'),
     "'ratio': fg_encoded_default_value 'a' .*not a number"),
], ids=["boundaries-and-buckets", "bool-mask-without-buckets", "dense-init-fn",
        "bad-default"])
def test_options_that_cannot_hold_are_config_errors(feature_set, features, detail):
    with pytest.raises(ConfigError, match=f"^feature {detail}"):
        feature_set(features, NONE)
