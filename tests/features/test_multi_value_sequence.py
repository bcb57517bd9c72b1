"""Id sequences of value_dim 0: an item holds all its values (raw and encoded input)."""

from __future__ import annotations

import pyarrow as pa
import pytest

from hashrec.config import ConfigError
from hashrec.features import FeatureError
from hashrec.tools.encode_input import encoded_columns

SEQ = ('feature_configs { sequence_feature { sequence_name: "s" sequence_length: 2 '
       'sequence_delim: ";" features { id_feature { feature_name: "i" expression: "item:i" '
       'embedding_dim: 4 num_buckets: 100 value_dim: 0 {options} } } features { raw_feature '
       '{ feature_name: "t" expression: "item:t" } } } }')
NONE = "data_config { dataset_type: ParquetDataset fg_mode: FG_NONE }"


def _config(options: str = "") -> str:
    return SEQ.replace("{options}", options)


def _items(batch, name="s__i"):
    """(ids, values per row, values per item, items per row)."""
    ids, items = batch.sparse[name], batch.sparse[f"{name}#items"]
    return (ids.values.tolist(), ids.lengths.tolist(), items.values.tolist(),
            items.lengths.tolist())


@pytest.mark.parametrize("column", [
    ["4\x1d5;6;7\x1d8", "\x1d9\x1d;", None],
    pa.array([["4\x1d5", "6", "7"], ["\x1d9\x1d", ""], None], pa.list_(pa.string())),
    pa.array([[[4, 5], [6], [7]], [[9], []], None], pa.list_(pa.list_(pa.int64()))),
], ids=["strings", "list-of-strings", "list-of-lists"])
def test_raw_items_hold_all_their_values(feature_set, column):
    fs = feature_set(_config())
    batch = fs.parse(pa.table({"s__i": column, "s__t": ["1;2;3", "1;2", None]}))
    # truncated to 2 items; an empty item and an empty cell read as the default "0"
    assert _items(batch) == ([4, 5, 6, 9, 0, 0], [3, 2, 1], [2, 1, 1, 1, 1], [2, 2, 1])
    spec = {f.name: f for f in fs.embedding_features()}["s__i"]
    assert (spec.is_sequence, spec.max_length, spec.multi_value) == (True, 2, True)


def test_an_item_missing_in_another_sub_feature_is_dropped_with_its_values(feature_set):
    fs = feature_set(_config().replace('"item:t" } }', '"item:t" default_value: "" } }'))
    batch = fs.parse(pa.table({"s__i": ["4\x1d5;6\x1d7"], "s__t": [";2"]}))
    # the first item has no "t" (no default to take): both of its ids go with it
    assert _items(batch) == ([6, 7], [2], [2], [1])
    assert batch.sequence_dense["s__t"][0, :, 0].tolist() == [2.0, 0.0]


def test_the_default_item_holds_the_defaults_values(feature_set):
    fs = feature_set(_config('default_value: "3\x1d7"'))
    batch = fs.parse(pa.table({"s__i": ["", "2"], "s__t": ["1", "1"]}))
    assert _items(batch) == ([3, 7, 2], [2, 1], [2, 1], [1, 1])


@pytest.mark.parametrize("column", [
    ["4\x035;6", None],
    pa.array([[[4, 5], [6]], None], pa.list_(pa.list_(pa.int64()))),
], ids=["joined-strings", "list-of-lists"])
def test_encoded_items_hold_all_their_values(feature_set, column):
    fs = feature_set(_config(), NONE)
    batch = fs.parse(pa.table({"s__i": column, "s__t": ["1;2", None]}))
    # an encoded empty cell (no fg_encoded_default_value) has no items
    assert _items(batch) == ([4, 5, 6], [3, 0], [2, 1], [2, 0])


def test_an_encoded_id_out_of_range_names_its_row(feature_set):
    fs = feature_set(_config(), NONE)
    with pytest.raises(FeatureError, match=r"'s__i'.*row 1.*100"):
        fs.parse(pa.table({"s__i": ["4\x035", "6\x03100"], "s__t": ["1", "2"]}))


def test_a_top_level_sequence_id_feature_of_value_dim_0(feature_set):
    fs = feature_set('feature_configs { sequence_id_feature { feature_name: "h" expression: '
                     '"user:h" embedding_dim: 4 hash_bucket_size: 50 sequence_length: 3 '
                     'sequence_delim: ";" separator: "," value_dim: 0 pooling: "mean" } }')
    batch = fs.parse(pa.table({"h": ["a,b;c", "d"]}))
    ids, per_row, sizes, items = _items(batch, "h")
    assert (per_row, sizes, items) == ([3, 1], [2, 1, 1], [2, 1])
    one = fs.parse(pa.table({"h": ["a;b;c", "d"]})).sparse["h"].values.tolist()
    assert ids == one  # each value hashed as it would be alone
    assert {f.name: f for f in fs.embedding_features()}["h"].pooling == "mean"


def test_encoding_raw_input_keeps_the_items(feature_set):
    raw, encoded = feature_set(_config()), feature_set(_config(), NONE)
    batch = raw.parse(pa.table({"s__i": ["4\x1d5;6", None], "s__t": ["1;2", "3"]}))
    columns = encoded_columns(batch, raw)
    assert columns["s__i"].to_pylist() == [[[4, 5], [6]], [[0]]]
    again = encoded.parse(pa.table(columns))
    assert _items(again) == _items(batch)
    assert again.sequence_dense["s__t"].tolist() == batch.sequence_dense["s__t"].tolist()


def test_a_feature_named_as_the_item_sizes_is_refused(feature_set):
    other = ('feature_configs { id_feature { feature_name: "s__i#items" expression: '
             '"item:x" embedding_dim: 4 num_buckets: 10 } }\n')
    with pytest.raises(ConfigError, match=r"'s__i#items': the name is taken by the item "
                                          r"sizes of sequence 's__i'"):
        feature_set(other + _config())
