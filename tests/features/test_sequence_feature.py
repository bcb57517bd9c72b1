"""Sequence features: splitting, truncation, shared tables, raw sub-features."""

from __future__ import annotations

import pyarrow as pa
import pytest

from hashrec.config import ConfigError
from hashrec.features import FeatureError

TOP = ('feature_configs { id_feature { feature_name: "item" expression: "item:item" '
       'embedding_dim: 4 dynamicemb { max_capacity: 100 } } }\n')
SEQ = ('feature_configs { sequence_feature { sequence_name: "s" sequence_length: 3 '
       'sequence_delim: "|" features { id_feature { feature_name: "item" '
       'expression: "item:item" embedding_dim: 4 } } features { raw_feature { '
       'feature_name: "price" expression: "item:price" } } } }\n')


def test_sub_features_split_truncate_and_share(feature_set):
    fs = feature_set(TOP + SEQ)
    batch = fs.parse(pa.table({
        "item": [1, 2],
        "s__item": ["5|6|7|8", ""],
        "s__price": ["1.5|2|3|4", None],
    }))
    jt = batch.sparse["s__item"]
    # most recent first: the first sequence_length items are kept; an empty cell is one
    # item of the default, "0" for an id sub-feature without one (as in TorchEasyRec)
    assert jt.values.tolist() == [5, 6, 7, 0]
    assert jt.lengths.tolist() == [3, 1]
    assert batch.sequence_dense["s__price"].shape == (2, 3, 1)
    assert batch.sequence_dense["s__price"][:, :, 0].tolist() == [[1.5, 2, 3], [0, 0, 0]]
    (table,) = fs.embedding_tables()
    assert table.name == "item" and table.features == ("item", "s__item") and table.is_dynamic
    spec = {f.name: f for f in fs.embedding_features()}["s__item"]
    assert (spec.table, spec.is_sequence, spec.max_length) == ("item", True, 3)
    assert fs.sequence_dense_features() == {"s__price": 1}
    assert fs.sequence_names() == {"s__item": "s", "s__price": "s"}


def test_list_columns(feature_set):
    fs = feature_set(TOP + SEQ)
    batch = fs.parse(pa.table({
        "item": [1],
        "s__item": pa.array([[9, 8, 7, 6]], pa.list_(pa.int64())),
        "s__price": pa.array([[1.0, 2.0, 3.0, 4.0]], pa.list_(pa.float64())),
    }))
    assert batch.sparse["s__item"].values.tolist() == [9, 8, 7]
    assert batch.sequence_dense["s__price"][0, :, 0].tolist() == [1, 2, 3]


CATE = SEQ.replace('features { raw_feature', 'features { id_feature { feature_name: "cate" '
                   'expression: "item:cate" embedding_dim: 4 num_buckets: 100 } } '
                   'features { raw_feature')


# price without a default_value: its missing items are left out of every sub-feature
NO_PRICE_DEFAULT = CATE.replace('expression: "item:price"',
                                'expression: "item:price" default_value: ""')


def test_missing_items_take_defaults_or_drop_from_every_sub_feature(feature_set):
    # item 0 has no category, which takes the id default "0", and item 1 no price, which
    # has none: the category and price of each kept item stay beside it, in string and
    # list columns alike; a row without a price cell keeps no item
    fs = feature_set(TOP + NO_PRICE_DEFAULT.replace("sequence_length: 3",
                                                    "sequence_length: 5"))
    for cate, price in ((["|22|23", "", None, "3|4"], ["1.0||3.0", "", None, "5|"]),
                        (pa.array([[None, 22, 23], [], None, [3, 4]], pa.list_(pa.int64())),
                         pa.array([[1.0, None, 3.0], [], None, [5.0, None]]))):
        batch = fs.parse(pa.table({"item": [1, 2, 3, 4], "s__item": ["11|12|13", "", None, "1|2"],
                                   "s__cate": cate, "s__price": price}))
        for name, values in (("s__item", [11, 13, 1]), ("s__cate", [0, 23, 3])):
            assert batch.sparse[name].values.tolist() == values
            assert batch.sparse[name].lengths.tolist() == [2, 0, 0, 1]
        assert batch.sequence_dense["s__price"][:, :3, 0].tolist() == \
            [[1, 3, 0], [0, 0, 0], [0, 0, 0], [5, 0, 0]]


def test_missing_items_are_dropped_before_truncation(feature_set):
    fs = feature_set(TOP + NO_PRICE_DEFAULT)
    batch = fs.parse(pa.table({"item": [1], "s__item": ["1|2|3|4|5"], "s__cate": ["6|7|8|9|10"],
                               "s__price": ["1||3|4|5"]}))
    assert batch.sparse["s__item"].values.tolist() == [1, 3, 4]
    assert batch.sparse["s__cate"].values.tolist() == [6, 8, 9]
    assert batch.sequence_dense["s__price"][0, :, 0].tolist() == [1, 3, 4]


def test_an_empty_cell_is_one_default_item(feature_set):
    # TorchEasyRec: an empty or null cell is one item of each sub-feature's default (an id
    # sub-feature's is "0" where unset, a raw sub-feature's "0" unless set)
    fs = feature_set(CATE.replace("num_buckets: 100", 'num_buckets: 100 default_value: "9"')
                     .replace('expression: "item:item" embedding_dim: 4',
                              'expression: "item:item" embedding_dim: 4 num_buckets: 100'))
    batch = fs.parse(pa.table({"s__item": ["", "7", None], "s__cate": [None, "", "5"],
                               "s__price": ["1.5", None, ""]}))
    assert batch.sparse["s__item"].values.tolist() == [0, 7, 0]
    assert batch.sparse["s__cate"].values.tolist() == [9, 9, 5]
    assert batch.sparse["s__item"].lengths.tolist() == [1, 1, 1]
    assert batch.sequence_dense["s__price"][:, 0, 0].tolist() == [1.5, 0, 0]


def test_sub_feature_default_fills_its_missing_items(feature_set):
    fs = feature_set(TOP + CATE.replace("num_buckets: 100", 'num_buckets: 100 default_value: "0"'))
    batch = fs.parse(pa.table({"item": [1], "s__item": ["11|12"], "s__cate": ["|22"],
                               "s__price": ["1|2"]}))
    assert batch.sparse["s__item"].values.tolist() == [11, 12]
    assert batch.sparse["s__cate"].values.tolist() == [0, 22]


def test_sub_features_with_different_item_counts_are_an_error(feature_set):
    fs = feature_set(TOP + CATE)
    with pytest.raises(FeatureError, match=r"sequence 's'.*'s__item' and 's__cate' row 1: "
                                           r"2 against 1 items"):
        fs.parse(pa.table({"item": [1, 2], "s__item": ["1", "2|3"], "s__cate": ["4", "5"],
                           "s__price": ["1", "2|3"]}))


def test_a_top_level_sequence_named_like_a_sequence_feature_is_parsed_alone(feature_set):
    hist = ('feature_configs { sequence_id_feature { feature_name: "s" expression: "user:hist" '
            'sequence_length: 4 sequence_delim: "|" embedding_dim: 4 num_buckets: 100 } }\n')
    batch = feature_set(TOP + CATE + hist).parse(pa.table({
        "item": [1], "s__item": ["1|2|3"], "s__cate": ["4|5|6"], "s__price": ["1|2|3"],
        "hist": ["7|8"]}))
    assert batch.sparse["s"].values.tolist() == [7, 8]
    assert batch.sparse["s__cate"].values.tolist() == [4, 5, 6]


@pytest.mark.parametrize("default", ["", 'default_value: "0"'], ids=["unset", "0"])
def test_top_level_sequence_reads_missing_items_as_its_default(feature_set, default):
    # TorchEasyRec resets an empty default_value of a sequence id feature to "0"
    seq = ('feature_configs { sequence_id_feature { feature_name: "hist" expression: '
           '"user:hist" sequence_length: 4 sequence_delim: "|" embedding_dim: 4 '
           f'num_buckets: 100 {default} }} }}\n')
    batch = feature_set(seq).parse(pa.table({"hist": ["1||3|", "", None]}), with_labels=False)
    assert batch.sparse["hist"].values.tolist() == [1, 0, 3, 0, 0, 0]
    assert batch.sparse["hist"].lengths.tolist() == [4, 1, 1]


@pytest.mark.parametrize("default", ["", 'default_value: "0"'], ids=["unset", "0"])
def test_sequence_vocab_list_as_torcheasyrec(feature_set, default):
    # TorchEasyRec's sequence_feature_test case: "0" is the vocabulary's id 0
    fs = feature_set('feature_configs { sequence_feature { sequence_name: "s" sequence_length: '
                     '50 sequence_delim: "|" features { id_feature { feature_name: "i" '
                     'expression: "user:i" embedding_dim: 4 vocab_list: ["a", "b", "c"] '
                     f'{default} }} }} }} }}')
    jt = fs.parse(pa.table({"s__i": ["c||a|b|b|", "", "a|b||c"]})).sparse["s__i"]
    assert jt.values.tolist() == [4, 0, 2, 3, 3, 0, 0, 2, 3, 0, 4]
    assert jt.lengths.tolist() == [6, 1, 4]


@pytest.mark.parametrize("vocab", ['vocab_list: ["a", "b"]',
                                   'vocab_dict { key: "a" value: 2 } vocab_dict { key: "b" '
                                   'value: 3 }'], ids=["list", "dict"])
@pytest.mark.parametrize("share", ["", 'embedding_name: "item_emb"'], ids=["table", "name"])
@pytest.mark.parametrize("owner_default", ["", 'default_value: "d"'], ids=["unset", "d"])
def test_a_shared_vocabulary_reads_the_sub_feature_default_as_id_0(feature_set, vocab, share,
                                                                   owner_default):
    # as were the vocabulary repeated in the sub-feature's config: its default "0" (an empty
    # cell's item) is id 0 and the owner's default_value, which it does not list, is OOV
    top = ('feature_configs { id_feature { feature_name: "item" expression: "item:item" '
           f'embedding_dim: 4 {vocab} {owner_default} }} }}\n')
    seq = ('feature_configs { sequence_feature { sequence_name: "s" sequence_length: 4 '
           'sequence_delim: "|" features { id_feature { feature_name: "item" '
           'expression: "item:item" embedding_dim: 4 OPTIONS } } } }\n')
    own = seq.replace("OPTIONS", vocab)
    seq = seq.replace("OPTIONS", share)
    columns = {"item": ["a", "b"], "s__item": ["b|a|d|x", ""]}
    shared = feature_set(top + seq).parse(pa.table(columns)).sparse["s__item"]
    alone = feature_set(top + own).parse(pa.table(columns)).sparse["s__item"]
    assert shared.values.tolist() == alone.values.tolist() == [3, 2, 1, 1, 0]
    assert shared.lengths.tolist() == [4, 1]


@pytest.mark.parametrize("default, token", [("", "0"), ("xyz", "xyz")], ids=["unset", "xyz"])
def test_sequence_hash_bucket_as_torcheasyrec(feature_set, default, token):
    fs = feature_set(_one_id_sequence(f'hash_bucket_size: 100 default_value: "{default}"'))
    jt = fs.parse(pa.table({"s__i": ["abc\x1defg;hij", "", "hij"]})).sparse["s__i"]
    want = fs.parse(pa.table({"s__i": ["abc;hij", token, "hij"]})).sparse["s__i"]
    assert jt.values.tolist() == want.values.tolist()
    assert jt.lengths.tolist() == [2, 1, 1]


def test_shared_num_buckets_are_checked(feature_set):
    top = ('feature_configs { id_feature { feature_name: "item" expression: "item:item" '
           'embedding_dim: 4 num_buckets: 10 } }\n')
    fs = feature_set(top + SEQ)
    with pytest.raises(Exception, match=r"'s__item'.*'s__item' row 0.*num_buckets=10"):
        fs.parse(pa.table({"item": [1], "s__item": ["3|12"], "s__price": ["1|2"]}))


def test_sub_feature_without_owner_or_bucketing(feature_set):
    with pytest.raises(ConfigError, match="s__item.*set one of"):
        feature_set(SEQ)


def test_sub_feature_dim_must_match_shared_table(feature_set):
    with pytest.raises(ConfigError, match="embedding_dim 4 differs"):
        feature_set(TOP.replace("embedding_dim: 4", "embedding_dim: 8") + SEQ)


def test_sub_feature_with_own_bucketing_gets_own_table(feature_set):
    seq = SEQ.replace('expression: "item:item" embedding_dim: 4 }',
                      'expression: "item:item" embedding_dim: 4 hash_bucket_size: 7 }')
    fs = feature_set(TOP + seq)
    assert [t.name for t in fs.embedding_tables()] == ["item", "s__item"]


def test_top_level_sequence_id_and_raw(feature_set):
    fs = feature_set(
        'feature_configs { sequence_id_feature { feature_name: "hist" expression: "user:hist" '
        'embedding_dim: 4 num_buckets: 50 sequence_length: 2 sequence_delim: ";" } }\n'
        'feature_configs { sequence_raw_feature { feature_name: "hp" expression: "user:hp" '
        'sequence_length: 2 sequence_delim: ";" } }')
    batch = fs.parse(pa.table({"hist": ["1;2;3", "4"], "hp": ["0.5;1;2", None]}))
    assert batch.sparse["hist"].values.tolist() == [1, 2, 4]
    assert batch.sparse["hist"].lengths.tolist() == [2, 1]
    assert batch.sequence_dense["hp"][:, :, 0].tolist() == [[0.5, 1.0], [0.0, 0.0]]
    # each top-level sequence feature is a sequence of its own
    assert fs.sequence_names() == {"hist": "hist", "hp": "hp"}


def test_sequence_length_required(feature_set):
    with pytest.raises(ConfigError, match="sequence_length > 0"):
        feature_set('feature_configs { sequence_id_feature { feature_name: "h" expression: '
                    '"user:h" embedding_dim: 4 num_buckets: 5 } }')


@pytest.mark.parametrize("kind, options", [
    ("id_feature", "num_buckets: 50"),
    ("raw_feature", ""),
], ids=["id", "raw"])
def test_sequence_length_on_a_plain_feature_is_refused(feature_set, kind, options):
    with pytest.raises(ConfigError, match=rf"'h': sequence_length is set on a {kind}.*"
                                          rf"sequence_{kind} or inside a sequence_feature"):
        feature_set(f'feature_configs {{ {kind} {{ feature_name: "h" expression: "user:h" '
                    f'embedding_dim: 4 {options} sequence_length: 5 }} }}')


@pytest.mark.parametrize("config", [
    'sequence_id_feature { feature_name: "h" expression: "user:h" embedding_dim: 4 '
    'hash_bucket_size: 50 sequence_length: 2 weighted: true }',
    'sequence_feature { sequence_name: "s" sequence_length: 3 sequence_delim: ";" '
    'features { id_feature { feature_name: "h" expression: "item:h" embedding_dim: 4 '
    'hash_bucket_size: 9 weighted: true } } }',
], ids=["sequence-id", "sub-feature"])
def test_weighted_sequence_is_refused(feature_set, config):
    with pytest.raises(ConfigError, match="weighted is not supported on sequence features"):
        feature_set(f"feature_configs {{ {config} }}")


def _one_id_sequence(options: str) -> str:
    return ('feature_configs { sequence_feature { sequence_name: "s" sequence_length: 5 '
            'sequence_delim: ";" features { id_feature { feature_name: "i" expression: '
            f'"item:i" embedding_dim: 4 {options} }} }} }} }}')


@pytest.mark.parametrize("options", ["hash_bucket_size: 100", "num_buckets: 100",
                                     "dynamicemb { max_capacity: 10 }",
                                     "num_buckets: 100 value_dim: 1"],
                         ids=["hash", "num-buckets", "dynamicemb", "value-dim-1"])
def test_an_item_of_several_values_is_its_first_value(feature_set, options):
    # TorchEasyRec splits an item on the separator ("\x1d"); a sequence's value_dim is 1
    fs = feature_set(_one_id_sequence(options))
    want = fs.parse(pa.table({"s__i": ["4;6", "7"]})).sparse["s__i"]
    for column in (["4\x1d5;6", "7"], ["\x1d4\x1d5;6", "7\x1d"],
                   pa.array([["4\x1d5", "6"], ["7"]], pa.list_(pa.string()))):
        got = fs.parse(pa.table({"s__i": column})).sparse["s__i"]
        assert got.values.tolist() == want.values.tolist(), column
        assert got.lengths.tolist() == [2, 1]


def test_a_top_level_sequence_splits_items_on_its_separator(feature_set):
    fs = feature_set('feature_configs { sequence_id_feature { feature_name: "h" expression: '
                     '"user:h" embedding_dim: 4 num_buckets: 50 sequence_length: 4 '
                     'sequence_delim: ";" separator: "," } }')
    batch = fs.parse(pa.table({"h": ["1,2;3", "4,5"]}))
    assert batch.sparse["h"].values.tolist() == [1, 3, 4]
    assert batch.sparse["h"].lengths.tolist() == [2, 1]


@pytest.mark.parametrize("value_dim", [2, 3])
def test_a_sequence_value_dim_other_than_0_or_1_is_refused(feature_set, value_dim):
    with pytest.raises(ConfigError, match=rf"'s__i': value_dim {value_dim} is not supported "
                                          r"on sequence features; set 0 .*or 1"):
        feature_set(_one_id_sequence(f"num_buckets: 10 value_dim: {value_dim}"))


def test_a_raw_item_of_several_values_names_its_row(feature_set):
    fs = feature_set(TOP + SEQ)
    with pytest.raises(FeatureError, match=r"'s__price': column 's__price' row 1: item "
                                           r"'0.1\\x1d1.1' holds several values"):
        fs.parse(pa.table({"item": [1, 2], "s__item": ["1|2", "3"],
                           "s__price": ["1|2", "0.1\x1d1.1"]}))
