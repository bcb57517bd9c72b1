"""combo_feature: crossed tokens."""

from __future__ import annotations

import pyarrow as pa
import pytest
import xxhash

from hashrec.config import ConfigError
from hashrec.features.combo_feature import CROSS_JOINER


def _combo(options: str) -> str:
    return ('feature_configs { combo_feature { feature_name: "x" expression: ["user:a", "item:b"] '
            f'embedding_dim: 4 separator: "," {options} }} }}')


def _h(a, b, size):
    return xxhash.xxh64_intdigest(f"{a}{CROSS_JOINER}{b}".encode()) % size


def test_cross_single_and_multi_value(feature_set):
    fs = feature_set(_combo("hash_bucket_size: 97"))
    batch = fs.parse(pa.table({"a": ["u1", "u2,u3", None], "b": ["i1", "i2,i3", "i4"]}))
    jt = batch.sparse["x"]
    assert jt.lengths.tolist() == [1, 4, 0]
    want = [_h("u1", "i1", 97), _h("u2", "i2", 97), _h("u2", "i3", 97), _h("u3", "i2", 97),
            _h("u3", "i3", 97)]
    assert jt.values.tolist() == want
    assert fs.input_columns == ["a", "b"]


def test_cross_is_ordered(feature_set):
    fs = feature_set(_combo("hash_bucket_size: 1000003"))
    ab = fs.parse(pa.table({"a": ["p"], "b": ["q"]})).sparse["x"].values.tolist()
    ba = fs.parse(pa.table({"a": ["q"], "b": ["p"]})).sparse["x"].values.tolist()
    assert ab != ba


def test_int_columns_cross_like_their_text(feature_set):
    fs = feature_set(_combo("hash_bucket_size: 50"))
    ints = fs.parse(pa.table({"a": [1], "b": [2]})).sparse["x"].values.tolist()
    text = fs.parse(pa.table({"a": ["1"], "b": ["2"]})).sparse["x"].values.tolist()
    assert ints == text == [_h(1, 2, 50)]


def test_a_vocabulary_names_crosses_joined_by_an_underscore(feature_set):
    # as TorchEasyRec's feature generation writes them (its combo_feature_test vectors)
    fs = feature_set(_combo('vocab_list: ["ua_ia", "ua_ib", "ub_ia"]'))
    batch = fs.parse(pa.table({"a": ["ua", "ua,ub", "uc"], "b": ["ia", "ib,ia", "ia"]}))
    # ids: 0 default, 1 out of vocabulary, then the list's entries from 2
    assert batch.sparse["x"].values.tolist() == [2, 3, 2, 1, 4, 1]


def test_a_row_missing_an_input_is_the_default_as_a_whole(feature_set):
    # as in TorchEasyRec: the default is not crossed with the other input's tokens
    fs = feature_set(_combo('vocab_list: ["ua_ia", "ua_ib", "ub_ia"] default_value: "xyz"'))
    batch = fs.parse(pa.table({"a": ["ua,ub", "ua,ub", "ua"], "b": ["ia,ib", "", None]}))
    assert batch.sparse["x"].lengths.tolist() == [4, 1, 1]
    assert batch.sparse["x"].values.tolist() == [2, 3, 4, 1, 0, 0]  # 0: the default's id
    hashed = feature_set(_combo('hash_bucket_size: 97 default_value: "xyz"'))
    got = hashed.parse(pa.table({"a": ["u1"], "b": [None]})).sparse["x"].values.tolist()
    assert got == [xxhash.xxh64_intdigest(b"xyz") % 97]


def test_needs_two_inputs(feature_set):
    with pytest.raises(ConfigError, match="at least two"):
        feature_set('feature_configs { combo_feature { feature_name: "x" expression: "user:a" '
                    'hash_bucket_size: 3 embedding_dim: 4 } }')


@pytest.mark.parametrize("kinds", [("large_string", "string"), ("string", "large_string"),
                                   ("large_string", "large_string")],
                         ids=["large-string", "string-large", "large-large"])
def test_large_string_columns_cross_like_strings(feature_set, kinds):
    # a large_string column (polars and pyarrow's large types write them) crossed with a
    # string one failed the batch; with a default, the filled row failed as well
    fs = feature_set(_combo('hash_bucket_size: 97 default_value: "xyz"'))
    a, b = (["u1,u2", "u3"], ["i1", None])
    strings = fs.parse(pa.table({"a": a, "b": b})).sparse["x"]
    large = fs.parse(pa.table({"a": pa.array(a, kinds[0]),
                               "b": pa.array(b, kinds[1])})).sparse["x"]
    assert large.values.tolist() == strings.values.tolist()
    assert large.lengths.tolist() == strings.lengths.tolist() == [2, 1]
