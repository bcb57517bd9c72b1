"""encode_input: raw input written as FG_NONE columns reads back to the same batches."""

from __future__ import annotations

import json
import os

import pyarrow as pa
import pyarrow.csv as pacsv
import pyarrow.parquet as pq
import pytest

from hashrec.config import ConfigError, load_pipeline_config, parse_pipeline_config
from hashrec.features import build_feature_set
from hashrec.tools.encode_input import encode, main
from hashrec.tools.gen_output import GeneratorError
from tests.features.test_feature_set import TAOBAO_CONFIG, taobao_table

FEATURES = '''
model_dir: "m"
data_config { batch_size: 4 dataset_type: ParquetDataset label_fields: "clk"
              sample_weight_fields: "w" fg_mode: FG_DAG }
feature_configs { id_feature { feature_name: "tags" expression: "item:tags" embedding_dim: 4
                  hash_bucket_size: 50 weighted: true separator: "," } }
feature_configs { raw_feature { feature_name: "p" expression: "item:p" value_dim: 2
                  separator: "," normalizer: "method=log10" } }
feature_configs { raw_feature { feature_name: "q" expression: "item:q" default_value: "7" } }
feature_configs { sequence_feature { sequence_name: "s" sequence_length: 2 sequence_delim: ";"
                  features { id_feature { feature_name: "i" expression: "item:i"
                                          embedding_dim: 4 num_buckets: 10 } }
                  features { raw_feature { feature_name: "t" expression: "item:t" } } } }
'''


def _table(rows: int) -> pa.Table:
    return pa.table({
        "tags": [f"a:0.5,b:{r}" if r % 3 else "" for r in range(rows)],
        "p": [f"{r + 1},{2 * r + 1}" for r in range(rows)],
        "q": [float(r) if r % 2 else None for r in range(rows)],
        "s__i": [";".join(str((r + k) % 10) for k in range(r % 4)) for r in range(rows)],
        "s__t": [";".join(f"{r}.{k}" for k in range(r % 4)) for r in range(rows)],
        "clk": [r % 2 for r in range(rows)],
        "w": [1.0 + r for r in range(rows)],
        "uid": [f"u{r}" for r in range(rows)],
    })


def _batches_equal(a, b) -> None:
    assert a.sparse.keys() == b.sparse.keys()
    assert a.sparse.values().equal(b.sparse.values())
    assert a.sparse.lengths().equal(b.sparse.lengths())
    weights = a.sparse.weights_or_none(), b.sparse.weights_or_none()
    assert (weights[0] is None) == (weights[1] is None)
    if weights[0] is not None:
        assert weights[0].equal(weights[1])
    for x, y in ((a.dense, b.dense), (a.sequence_dense, b.sequence_dense), (a.labels, b.labels)):
        assert x.keys() == y.keys()
        assert all(x[k].equal(y[k]) for k in x)


def _encoded(tmp_path, config, table, **kwargs):
    pq.write_table(table, tmp_path / "raw.parquet")
    rows, names = encode(config, str(tmp_path / "raw.parquet"), str(tmp_path / "out"),
                         quiet=True, **kwargs)
    return rows, names, pa.concat_tables(pq.read_table(tmp_path / "out" / n) for n in names)


def test_weighted_dense_and_sequence_features_read_back_the_same(tmp_path):
    config = parse_pipeline_config(FEATURES)
    table = _table(11)
    rows, names, out = _encoded(tmp_path, config, table, reserved=("uid",), rows_per_file=4)
    assert rows == 11 and names == ["part-00000.parquet", "part-00001.parquet",
                                    "part-00002.parquet"]
    marker = json.loads((tmp_path / "out" / "_encode_input.json").read_text())
    assert marker == {"files": names, "rows": 11, "complete": True}
    assert set(out.column_names) == {"tags", "p", "q", "s__i", "s__t", "clk", "w", "uid"}
    assert out["uid"].to_pylist() == table["uid"].to_pylist()
    raw = build_feature_set(config).parse(table)
    config.data_config.fg_mode = 1  # FG_NONE
    _batches_equal(build_feature_set(config).parse(out), raw)


def test_sequence_items_of_several_values_read_back_as_raw_input_reads_them(tmp_path):
    # raw input (value_dim 1) reads an item of several values as its first value; the
    # output holds that one id per item, which FG_NONE reads (it refuses several)
    config = parse_pipeline_config(FEATURES)
    table = _table(6)
    table = table.set_column(table.schema.get_field_index("s__i"), "s__i",
                             pa.array(["", "4\x1d9", "5;6\x1d2\x1d3", "7;8;9", "", "1"]))
    raw = build_feature_set(config).parse(table)
    assert raw.sparse["s__i"].values.tolist()[:4] == [0, 4, 5, 6]  # "" reads as "0"
    _, _, out = _encoded(tmp_path, config, table)
    config.data_config.fg_mode = 1  # FG_NONE
    _batches_equal(build_feature_set(config).parse(out), raw)


def test_the_taobao_example_reads_back_the_same(tmp_path):
    config = load_pipeline_config(TAOBAO_CONFIG)
    config.data_config.dataset_type = 2  # ParquetDataset
    table = taobao_table(300, seed=4)
    raw = build_feature_set(config).parse(table)
    _, _, out = _encoded(tmp_path, config, table, batch_size=64)
    config.data_config.fg_mode = 1
    _batches_equal(build_feature_set(config).parse(out), raw)


def test_encoded_input_is_not_encoded_again(tmp_path):
    config = parse_pipeline_config(FEATURES.replace("fg_mode: FG_DAG", "fg_mode: FG_NONE"))
    with pytest.raises(ValueError, match="encoded already"):
        _encoded(tmp_path, config, _table(3))


def test_a_sequence_raw_feature_without_an_id_feature_is_refused(tmp_path):
    text = FEATURES.replace('''features { id_feature { feature_name: "i" expression: "item:i"
                                          embedding_dim: 4 num_buckets: 10 } }''', "")
    with pytest.raises(ValueError, match="feature 's__t': .*sequence 's' has none"):
        _encoded(tmp_path, parse_pipeline_config(text), _table(3))


def test_a_feature_without_expression_is_refused_before_writing(tmp_path):
    # raw input's column comes from the expression, which encoded input's configs leave out
    config = parse_pipeline_config(FEATURES.replace(' expression: "item:q"', ""))
    with pytest.raises(ConfigError, match="feature 'q' .*sets no expression.*raw input "
                                          "\\(data_config.fg_mode is FG_DAG\\).*add one"):
        _encoded(tmp_path, config, _table(3))
    assert not (tmp_path / "out").exists()


def test_a_directory_of_other_files_is_refused(tmp_path):
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    with pytest.raises(GeneratorError, match="not empty"):
        _encoded(tmp_path, parse_pipeline_config(FEATURES), _table(3))
    assert os.listdir(tmp_path / "out") == ["notes.txt"]


def test_the_command_line(tmp_path, capsys):
    config = tmp_path / "pipeline.config"
    config.write_text(FEATURES)
    pq.write_table(_table(5), tmp_path / "raw.parquet")
    args = ["--pipeline_config_path", str(config), "--input_path", str(tmp_path / "raw.parquet"),
            "--output_dir", str(tmp_path / "out"), "--quiet"]
    assert main(args) == 0
    assert "wrote 5 rows in 1 files" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main([*args, "--rows_per_file", "0"])
    assert main(["--pipeline_config_path", str(config), "--output_dir", str(tmp_path / "o")]) == 1
    assert "no input: pass --input_path" in capsys.readouterr().err


def test_the_command_line_edits_the_config(tmp_path):
    # the CSV input of a parquet config, as train_eval's --edit_config_json reads it
    config = tmp_path / "pipeline.config"
    config.write_text(FEATURES)
    pacsv.write_csv(_table(5), tmp_path / "raw.csv")
    edits = {"data_config.dataset_type": "CsvDataset", "data_config.with_header": True}
    assert main(["--pipeline_config_path", str(config), "--input_path",
                 str(tmp_path / "raw.csv"), "--output_dir", str(tmp_path / "out"), "--quiet",
                 "--edit_config_json", json.dumps(edits)]) == 0
    assert pq.read_table(tmp_path / "out").num_rows == 5


def test_csv_labels_and_weights_are_written_as_numbers(tmp_path):
    # before, a CSV file's label and weight texts were copied as strings
    config = tmp_path / "pipeline.config"
    config.write_text(FEATURES)
    table = _table(5).set_column(5, "clk", pa.array([0.0, 1.0, 0.25, 1.0, 0.0]))
    pacsv.write_csv(table, tmp_path / "raw.csv")
    edits = {"data_config.dataset_type": "CsvDataset", "data_config.with_header": True}
    assert main(["--pipeline_config_path", str(config), "--input_path",
                 str(tmp_path / "raw.csv"), "--output_dir", str(tmp_path / "out"), "--quiet",
                 "--reserved_columns", "uid,clk", "--edit_config_json",
                 json.dumps(edits)]) == 0
    out = pq.read_table(tmp_path / "out")
    assert out.schema.field("clk").type == pa.float32()
    assert out.schema.field("w").type == pa.float32()
    assert out["clk"].to_pylist() == [0.0, 1.0, 0.25, 1.0, 0.0]
    assert out["w"].to_pylist() == [1.0, 2.0, 3.0, 4.0, 5.0]
    assert out["uid"].to_pylist() == [f"u{r}" for r in range(5)]  # reserved: as it is


def test_a_class_label_is_written_as_an_integer(tmp_path):
    text = FEATURES + ('model_config { feature_groups { group_name: "g" feature_names: "q" '
                       'group_type: DEEP } num_class: 3 losses { softmax_cross_entropy {} } '
                       'multi_tower { towers { input: "g" mlp { hidden_units: [4] } } } }')
    table = _table(4).set_column(5, "clk", pa.array(["2", "0", "1", "2"]))
    _, _, out = _encoded(tmp_path, parse_pipeline_config(text), table)
    assert out.schema.field("clk").type == pa.int64()
    assert out["clk"].to_pylist() == [2, 0, 1, 2]


def test_a_reserved_column_named_as_a_feature_is_refused(tmp_path):
    # it would replace the feature's encoded column with the raw one
    with pytest.raises(ValueError, match="reserved column 'tags' is named as a feature"):
        _encoded(tmp_path, parse_pipeline_config(FEATURES), _table(3), reserved=("uid", "tags"))
    assert not (tmp_path / "out").exists()


def test_prediction_input_without_labels_is_encoded_without_them(tmp_path):
    config = parse_pipeline_config(FEATURES)
    table = _table(5).drop(["clk", "w"])
    rows, _, out = _encoded(tmp_path, config, table, reserved=("uid",), labels=False)
    assert rows == 5
    assert set(out.column_names) == {"tags", "p", "q", "s__i", "s__t", "uid"}
    raw = build_feature_set(config).parse(table, with_labels=False)
    config.data_config.fg_mode = 1  # FG_NONE
    _batches_equal(build_feature_set(config).parse(out, with_labels=False), raw)


def test_the_command_line_says_prediction_input_is_for_prediction(tmp_path, capsys):
    config = tmp_path / "pipeline.config"
    config.write_text(FEATURES)
    pq.write_table(_table(4).drop(["clk", "w"]), tmp_path / "raw.parquet")
    assert main(["--pipeline_config_path", str(config), "--input_path",
                 str(tmp_path / "raw.parquet"), "--output_dir", str(tmp_path / "out"),
                 "--quiet", "--no_labels"]) == 0
    said = capsys.readouterr().err
    assert "wrote 4 rows in 1 files" in said and "predict on them" in said
    assert "train on them" not in said


def test_a_label_named_as_a_feature_is_refused(tmp_path):
    # a PEPNet's domain label may be a feature's name; one output column cannot hold both
    from tests.features.test_feature_set import DOMAIN_CONFIG, _domain_table

    config = parse_pipeline_config(DOMAIN_CONFIG.replace("ParquetDataset",
                                                         "ParquetDataset fg_mode: FG_DAG"))
    with pytest.raises(ValueError, match="label column 'occupation' is named as a feature"):
        _encoded(tmp_path, config, _domain_table([0, 1, 1]))
    # named apart, the domain index is written as an integer
    renamed = DOMAIN_CONFIG.replace('feature_name: "occupation"', 'feature_name: "occ"') \
        .replace('feature_names: ["age_level", "occupation"]', 'feature_names: ["age_level"]') \
        .replace('feature_names: "occupation"', 'feature_names: "occ"')
    _, _, out = _encoded(tmp_path, parse_pipeline_config(renamed), _domain_table([0, 1, 1]))
    assert out.schema.field("occupation").type == pa.int64()
    assert out["occupation"].to_pylist() == [0, 1, 1]
    assert out["occ"].to_pylist() == [[0], [1], [1]]
