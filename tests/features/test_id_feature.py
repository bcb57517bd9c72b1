"""id_feature: num_buckets, hashing, vocabularies, dynamic ids, multi-value, weights, nulls."""

from __future__ import annotations

import re

import numpy as np
import pyarrow as pa
import pytest
import xxhash

from hashrec.config import ConfigError
from hashrec.features import FeatureError


def _id(options: str, name: str = "f", column: str = "c") -> str:
    return (f'feature_configs {{ id_feature {{ feature_name: "{name}" expression: "user:{column}"'
            f' embedding_dim: 4 {options} }} }}')


def _bags(batch, name):
    jt = batch.sparse[name]
    return jt.values.tolist(), jt.lengths.tolist()


def test_num_buckets_in_range(feature_set):
    fs = feature_set(_id("num_buckets: 10"))
    batch = fs.parse(pa.table({"c": [3, 0, 9]}))
    assert _bags(batch, "f") == ([3, 0, 9], [1, 1, 1])
    assert fs.embedding_tables()[0].num_rows == 10


@pytest.mark.parametrize("values, bad_row", [([1, 10, 2], 1), ([1, 2, -1], 2)],
                         ids=["too-large", "negative"])
def test_num_buckets_out_of_range_names_feature_column_row(feature_set, values, bad_row):
    fs = feature_set(_id("num_buckets: 10"))
    with pytest.raises(FeatureError, match=rf"'f'.*'c' row {bad_row}.*num_buckets=10"):
        fs.parse(pa.table({"c": values}))


def test_num_buckets_string_ids_and_non_integer(feature_set):
    fs = feature_set(_id('num_buckets: 10 separator: ","'))
    assert _bags(fs.parse(pa.table({"c": ["1,2", "7"]})), "f") == ([1, 2, 7], [2, 1])
    with pytest.raises(FeatureError, match="'c' row 1: expected an integer id"):
        fs.parse(pa.table({"c": ["1", "x"]}))


def test_hash_bucket_size_is_stable_xxhash(feature_set):
    fs = feature_set(_id("hash_bucket_size: 1000"))
    batch = fs.parse(pa.table({"c": ["apple", "pear", "apple"]}))
    want = [xxhash.xxh64_intdigest(b"apple") % 1000, xxhash.xxh64_intdigest(b"pear") % 1000]
    assert _bags(batch, "f") == ([want[0], want[1], want[0]], [1, 1, 1])
    # an integer id hashes like its decimal text
    ints = fs.parse(pa.table({"c": pa.array([42], pa.int64())}))
    assert ints.sparse["f"].values.tolist() == [xxhash.xxh64_intdigest(b"42") % 1000]


def test_vocab_list_default_convention(feature_set):
    fs = feature_set(_id('vocab_list: ["a", "b", "c"]'))
    assert _bags(fs.parse(pa.table({"c": ["b", "zz", "a"]})), "f") == ([3, 1, 2], [1, 1, 1])
    assert fs.embedding_tables()[0].num_rows == 5


def test_vocab_list_with_default_bucketize_value(feature_set):
    fs = feature_set(_id('vocab_list: ["a", "b"] default_bucketize_value: 2'))
    assert _bags(fs.parse(pa.table({"c": ["b", "zz", "a"]})), "f") == ([1, 2, 0], [1, 1, 1])
    assert fs.embedding_tables()[0].num_rows == 3


def test_vocab_dict(feature_set):
    fs = feature_set(_id('vocab_dict { key: "x" value: 5 } vocab_dict { key: "y" value: 2 } '
                         'default_bucketize_value: 0'))
    assert _bags(fs.parse(pa.table({"c": ["y", "x", "q"]})), "f") == ([2, 5, 0], [1, 1, 1])
    assert fs.embedding_tables()[0].num_rows == 6


@pytest.mark.parametrize("options, shared", [
    ('vocab_dict { key: "x" value: 1 } vocab_dict { key: "y" value: 2 }', ["'x' on id 1"]),
    ('default_value: "d" vocab_dict { key: "x" value: 0 } vocab_dict { key: "y" value: 3 }',
     ["'x' on id 0"]),
    ('vocab_dict { key: "x" value: 0 } vocab_dict { key: "y" value: 2 }', []),
    ('default_value: "x" vocab_dict { key: "x" value: 1 } vocab_dict { key: "y" value: 2 }', []),
    ('vocab_dict { key: "x" value: 1 } default_bucketize_value: 0', []),
], ids=["oov-row", "default-row", "empty-default-no-row", "default-entry", "bucketize-value"])
def test_vocab_dict_ids_on_default_or_oov_row_warn(feature_set, caplog, options, shared):
    # TorchEasyRec warns of vocab_dict ids below 2 without default_bucketize_value: id 0
    # is the default_value's row and id 1 the out-of-vocabulary tokens'.
    with caplog.at_level("WARNING", logger="hashrec.features"):
        feature_set(_id(options))
    warned = [r.getMessage() for r in caplog.records if "vocab_dict puts" in r.getMessage()]
    assert len(warned) == (1 if shared else 0)
    for entry in shared:
        assert entry in warned[0] and "'f'" in warned[0]


def test_dynamicemb_keeps_raw_ids_and_hashes_strings(feature_set):
    fs = feature_set(_id("dynamicemb { max_capacity: 100 }"))
    big = 2**40 + 3
    assert _bags(fs.parse(pa.table({"c": [big, -5]})), "f") == ([big, -5], [1, 1])
    batch = fs.parse(pa.table({"c": ["17", "abc"]}))
    want = np.array([xxhash.xxh64_intdigest(b"abc")], dtype=np.uint64).view(np.int64)[0]
    assert batch.sparse["f"].values.tolist() == [17, int(want)]


def test_uint64_ids_past_int64_are_the_keys_of_their_text(feature_set):
    fs = feature_set(_id("dynamicemb { max_capacity: 100 }"))
    ids = [2**63 + 5, 7, 2**64 - 1]
    from_ints = fs.parse(pa.table({"c": pa.array(ids, pa.uint64())})).sparse["f"].values
    from_text = fs.parse(pa.table({"c": [str(i) for i in ids]})).sparse["f"].values
    assert from_ints.tolist() == from_text.tolist()
    assert from_ints.tolist()[1] == 7


@pytest.mark.parametrize("options", ["hash_bucket_size: 1000000", 'vocab_list: ["3", "98765432101"]'])
def test_integral_float_ids_read_as_their_integer(feature_set, options):
    # pandas writes an integer id column with a missing value as floats; Arrow's text of
    # 98765432101.0 is 9.8765432101e+10
    fs = feature_set(_id(options))
    ints = fs.parse(pa.table({"c": pa.array([3, 98765432101, 10**15], pa.int64())}))
    floats = fs.parse(pa.table({"c": [3.0, 98765432101.0, 1e15, None]}))
    assert floats.sparse["f"].values.tolist() == ints.sparse["f"].values.tolist()
    assert floats.sparse["f"].lengths.tolist() == [1, 1, 1, 0]
    halves = fs.parse(pa.table({"c": [1.5]})).sparse["f"].values.tolist()
    assert halves == fs.parse(pa.table({"c": ["1.5"]})).sparse["f"].values.tolist()


@pytest.mark.parametrize("options", ["dynamicemb { max_capacity: 100 }", "num_buckets: 100",
                                     "hash_bucket_size: 1000", 'vocab_list: ["12", "7"]'])
def test_integral_floats_and_zero_fraction_texts_are_their_integers(feature_set, options):
    # a parquet file of int64 ids and one written by pandas with a missing value (floats),
    # or a CSV of the latter (texts "12.0"): one id each
    fs = feature_set(_id(options))
    want = fs.parse(pa.table({"c": pa.array([12, 7], pa.int64())})).sparse["f"].values
    for column in ([12.0, 7.0], ["12.0", "7.00"], ["12", "7.0"]):
        got = fs.parse(pa.table({"c": column})).sparse["f"].values
        assert got.tolist() == want.tolist(), column


def test_float_ids_with_a_fraction_are_refused_naming_the_row(feature_set):
    fs = feature_set(_id("dynamicemb { max_capacity: 100 }"))
    with pytest.raises(FeatureError, match=r"'f'.*'c'.*row 1: float id 2.5 is not an integer"):
        fs.parse(pa.table({"c": [1.0, 2.5]}))


def test_multi_value_nulls_and_empty_bags(feature_set):
    fs = feature_set(_id('num_buckets: 100 separator: "|"'))
    batch = fs.parse(pa.table({"c": ["1|2|3", None, "", "4||5"]}))
    assert _bags(batch, "f") == ([1, 2, 3, 4, 5], [3, 0, 0, 2])


def test_default_value_fills_nulls(feature_set):
    fs = feature_set(_id('num_buckets: 100 default_value: "7"'))
    assert _bags(fs.parse(pa.table({"c": pa.array([1, None], pa.int64())})), "f") == ([1, 7], [1, 1])


def test_list_column(feature_set):
    fs = feature_set(_id("num_buckets: 100"))
    batch = fs.parse(pa.table({"c": pa.array([[1, 2], [], None, [3]], pa.list_(pa.int64()))}))
    assert _bags(batch, "f") == ([1, 2, 3], [2, 0, 0, 1])


def test_weighted(feature_set):
    fs = feature_set(_id('num_buckets: 100 separator: "," weighted: true'))
    batch = fs.parse(pa.table({"c": ["1:0.5,2:2", "3:1"]}))
    assert _bags(batch, "f") == ([1, 2, 3], [2, 1])
    assert batch.sparse.weights().tolist() == [0.5, 2.0, 1.0]
    assert fs.embedding_features()[0].weighted
    with pytest.raises(FeatureError, match="row 1.*not id:weight"):
        fs.parse(pa.table({"c": ["1:1", "2"]}))


def test_missing_column_and_wrong_dtype(feature_set):
    fs = feature_set(_id("num_buckets: 10"))
    with pytest.raises(FeatureError, match="'f'.*column 'c' is missing"):
        fs.parse(pa.table({"other": [1]}))
    with pytest.raises(FeatureError, match="'f'.*'c' row 1: expected an integer id"):
        fs.parse(pa.table({"c": [2.0, 1.5]}))
    with pytest.raises(FeatureError, match="'f'.*'c' has type bool"):
        fs.parse(pa.table({"c": [True]}))


@pytest.mark.parametrize("options, message", [
    ("", "set one of"),
    ("num_buckets: 3 hash_bucket_size: 4", "only one of"),
    ("num_buckets: 0", "num_buckets must be > 0"),
    ('num_buckets: 3 pooling: "max"', "pooling 'max'"),
], ids=["no-bucketing", "two-bucketings", "zero-buckets", "bad-pooling"])
def test_config_errors(feature_set, options, message):
    with pytest.raises(ConfigError, match=message):
        feature_set(_id(options))


# Tokens at the edges of "is this a decimal int64": signs, leading zeros, 19 digits,
# the int64 limits, overflow, zero fractions and texts Arrow's integer cast would read (hex).
INT_EDGE_TOKENS = ["7", "+7", "-7", "007", "0", "00", "-0", "-07", "1234567890123456789",
                   str(2**63 - 1), str(-(2**63)), str(2**63), "99999999999999999999",
                   "12.0", "012.0", "+12.0", "-0.0", "0x10", "1e3", " 7", "７", "abc"]


def _reference_key(token: str) -> int:
    """A dynamic key as the module docstring states it: the int64 of an integer's canonical
    decimal text (with or without a zero fraction), else the xxhash64 of the text."""
    match = re.fullmatch(r"(0|-?[1-9][0-9]*)(\.0+)?", token)
    if match and -(2**63) <= int(match.group(1)) < 2**63:
        return int(match.group(1))
    return int(np.array([xxhash.xxh64_intdigest(token.encode())], np.uint64).view(np.int64)[0])


@pytest.mark.parametrize("options", ["dynamicemb { max_capacity: 100 }", "zch { zch_size: 10 }"],
                         ids=["dynamicemb", "zch"])
def test_distinct_strings_are_distinct_dynamic_keys(feature_set, options):
    # "01234" is not the text "1234" of the integer 1234, nor "+5" that of 5
    fs = feature_set(_id(options))
    tokens = ["01234", "1234", "+5", "5", "-0", "0", "012.0", "12", "12.0"]
    keys = fs.parse(pa.table({"c": tokens})).sparse["f"].values.tolist()
    assert len(set(keys[:-1])) == len(tokens) - 1 and keys[-1] == keys[-2] == 12
    for column in (["01234", "0"], ["1234", "5"]):  # digits-only columns, whole or not
        assert fs.parse(pa.table({"c": column})).sparse["f"].values.tolist() == \
            [_reference_key(t) for t in column]


@pytest.mark.parametrize("token", INT_EDGE_TOKENS)
def test_dynamic_key_depends_on_the_token_alone(feature_set, token):
    fs = feature_set(_id("dynamicemb { max_capacity: 100 }"))
    alone = fs.parse(pa.table({"c": [token]})).sparse["f"].values.tolist()
    # next to an integer, next to a hashed string, and among all the edge tokens
    for other in (["5"], ["abc"], INT_EDGE_TOKENS):
        mixed = fs.parse(pa.table({"c": [*other, token]})).sparse["f"].values.tolist()
        assert mixed[-1] == alone[0] == _reference_key(token)


def test_num_buckets_reads_exactly_decimal_ints(feature_set):
    fs = feature_set(_id('num_buckets: 100 separator: ","'))
    assert _bags(fs.parse(pa.table({"c": ["+7,-0,007"]})), "f") == ([7, 0, 7], [3])
    assert _bags(fs.parse(pa.table({"c": ["+7.0,-0.0,007.0"]})), "f") == ([7, 0, 7], [3])
    with pytest.raises(FeatureError, match=r"row 1: expected an integer id \(value '0x10'\)"):
        fs.parse(pa.table({"c": ["1", "0x10"]}))


@pytest.mark.parametrize("default, want_weight", [("7", 1.0), ("7:0.25", 0.25)],
                         ids=["id-only", "id-weight"])
def test_weighted_default_value_fills_missing_cells(feature_set, default, want_weight):
    fs = feature_set(_id(f'num_buckets: 100 separator: "," weighted: true '
                         f'default_value: "{default}"'))
    batch = fs.parse(pa.table({"c": ["1:0.5", None, ""]}))
    assert _bags(batch, "f") == ([1, 7, 7], [1, 1, 1])
    assert batch.sparse.weights().tolist() == [0.5, want_weight, want_weight]


@pytest.mark.parametrize("weight", ["nan", "inf", "-inf", "", "x", "1e99"],
                         ids=["nan", "inf", "neg-inf", "empty", "text", "overflow"])
def test_weighted_bad_weight_names_row(feature_set, weight):
    fs = feature_set(_id('num_buckets: 100 separator: "," weighted: true'))
    with pytest.raises(FeatureError,
                       match=rf"'f': column 'c' row 1: weight '{weight}' is not a finite number"):
        fs.parse(pa.table({"c": ["1:1,2:2", f"3:1,4:{weight}"]}))


@pytest.mark.parametrize("vocab, want", [
    ('vocab_list: ["a", "b", "c"]', [3, 0, 0, 0, 1]),
    ('vocab_dict { key: "b" value: 7 } vocab_dict { key: "a" value: 2 }', [7, 0, 0, 0, 1]),
], ids=["list", "dict"])
def test_vocab_default_value_reads_as_id_0(feature_set, vocab, want):
    # TorchEasyRec: without default_bucketize_value, default_value is id 0 and OOV id 1
    fs = feature_set(_id(f'{vocab} default_value: "d"'))
    batch = fs.parse(pa.table({"c": ["b", None, "", "d", "zz"]}))
    assert _bags(batch, "f") == (want, [1, 1, 1, 1, 1])


@pytest.mark.parametrize("canonical", [True, False], ids=["canonical", "any-decimal"])
def test_integer_tokens_are_read_from_their_bytes_as_the_rule_states(canonical):
    """``int_tokens`` (a whole-column cast where no byte is a letter, else the tokens'
    bytes, not a regex) against its rule within int64 (``^(0|-?[1-9][0-9]*)$``, dynamic
    keys, or ``^[+-]?[0-9]+$``, num_buckets; a zero fraction reads as the integer), on
    random tokens of digits, signs, dots, spaces, letters and multi-byte digits, with
    nulls, in sliced and large string arrays."""
    import random

    from hashrec.features.bucketize import int_tokens

    integer = r"(0|-?[1-9][0-9]*)" if canonical else r"([+-]?[0-9]+)"
    rule = re.compile(integer + r"(\.0+)?\Z")
    letters = [*"0123456789+- xaf", "７", "é", "99999999999"]
    no_letters = [*"0123456789+- .", "99999999999"]  # columns the whole-column cast takes
    rng = random.Random(0)
    for trial in range(800):
        alphabet = letters if trial % 2 else no_letters
        tokens = ["".join(rng.choice(alphabet) for _ in range(rng.randint(0, 5)))
                  if rng.random() > 0.1 else None for _ in range(rng.randint(1, 10))]
        array = pa.array(tokens, pa.string())
        for values in (array, array.slice(1), pa.array(tokens, pa.large_string())):
            is_int, ints = int_tokens(values, canonical)
            for token, got, value in zip(values.to_pylist(), is_int, ints):
                match = rule.match(token) if token is not None else None
                want = match is not None and -(2**63) <= int(match.group(1)) < 2**63
                assert bool(got) == want, token
                if want:
                    assert int(value) == int(match.group(1)), token


@pytest.mark.parametrize("options", ["num_buckets: 10", "hash_bucket_size: 10",
                                     "dynamicemb { max_capacity: 10 }", "zch { zch_size: 10 }",
                                     'vocab_list: ["7"]'],
                         ids=["num-buckets", "hash", "dynamicemb", "zch", "vocab"])
@pytest.mark.parametrize("list_type", [pa.list_(pa.null()), pa.large_list(pa.null())],
                         ids=["list", "large-list"])
def test_a_list_column_of_nulls_is_all_missing_cells(feature_set, options, list_type):
    # pyarrow infers list<null> for a column whose lists are all empty or null
    column = pa.array([[], None, []], list_type)
    assert _bags(feature_set(_id(options)).parse(pa.table({"c": column})), "f") == \
        ([], [0, 0, 0])
    with_default = feature_set(_id(f'{options} default_value: "7"'))
    want = _bags(with_default.parse(pa.table({"c": ["7", "7", "7"]})), "f")
    assert _bags(with_default.parse(pa.table({"c": column})), "f") == want
