"""raw_feature: dense values, value_dim, normalizers, boundaries, bad numbers."""

from __future__ import annotations

import math
import re

import numpy as np
import pyarrow as pa
import pytest

from hashrec.config import ConfigError
from hashrec.features import FeatureError


def _raw(options: str = "") -> str:
    return f'feature_configs {{ raw_feature {{ feature_name: "r" expression: "item:c" {options} }} }}'


def test_dense_values_and_null_default(feature_set):
    fs = feature_set(_raw('default_value: "-1"'))
    batch = fs.parse(pa.table({"c": pa.array([1.5, None, 3.0])}))
    assert batch.dense["r"].tolist() == [[1.5], [-1.0], [3.0]]
    assert batch.dense["r"].dtype.is_floating_point
    assert fs.dense_features() == {"r": 1}
    assert fs.output_dim("r") == 1


def test_value_dim_from_strings_and_lists(feature_set):
    fs = feature_set(_raw('value_dim: 2 separator: ","'))
    assert fs.parse(pa.table({"c": ["1,2", "3,4"]})).dense["r"].tolist() == [[1, 2], [3, 4]]
    lists = pa.array([[1.0, 2.0], [3.0, 4.0]], pa.list_(pa.float64()))
    assert fs.parse(pa.table({"c": lists})).dense["r"].tolist() == [[1, 2], [3, 4]]
    with pytest.raises(FeatureError, match="row 1: has 1 values, expected value_dim=2"):
        fs.parse(pa.table({"c": ["1,2", "3"]}))
    # The config's default_value ("0" unless set) fills missing cells: one value for two.
    with pytest.raises(FeatureError, match=r"row 1: has 1 values, expected value_dim=2 \(a "
                                           r"missing cell takes default_value '0', 1 value\(s\); "
                                           r"give it 2 values separated by ','\)"):
        fs.parse(pa.table({"c": ["1,2", None]}))
    filled = feature_set(_raw('value_dim: 2 separator: "," default_value: "0,0"'))
    assert filled.parse(pa.table({"c": ["1,2", None]})).dense["r"].tolist() == [[1, 2], [0, 0]]


@pytest.mark.parametrize("bad", [math.nan, math.inf, -math.inf], ids=["nan", "inf", "-inf"])
def test_non_finite_values_name_feature_and_row(feature_set, bad):
    fs = feature_set(_raw())
    with pytest.raises(FeatureError, match=r"'r'.*'c' row 2.*not finite"):
        fs.parse(pa.table({"c": [1.0, 2.0, bad]}))


def test_non_numeric_strings_name_the_row_and_the_value(feature_set):
    # the row was not named, only the column's type ("holds values that are not numbers")
    with pytest.raises(FeatureError, match=r"'r': column 'c' row 1: value 'x' is not a number"):
        feature_set(_raw()).parse(pa.table({"c": ["1", "x"]}))
    cells = ["1,2", None, "3, 4", "5,6"]  # " 4": a space is not read as a number
    with pytest.raises(FeatureError, match=r"'c' row 2: value ' 4' is not a number"):
        feature_set(_raw('value_dim: 2 separator: ","')).parse(pa.table({"c": cells}))


@pytest.mark.parametrize("normalizer, values, want", [
    ("method=log10,threshold=1e-10,default=-10", [100.0, 0.0], [2.0, -10.0]),
    ("method=zscore,mean=1,standard_deviation=2", [5.0, 1.0], [2.0, 0.0]),
    ("method=minmax,min=2,max=4", [3.0, 4.0], [0.5, 1.0]),
    ("method=expression,expr=log(x+3)", [-2.0, 1.0], [0.0, math.log(4.0)]),
    ("method=expression,expr=x > 1 ? sqrt(x) : -x^2", [4.0, -3.0], [2.0, -9.0]),
], ids=["log10", "zscore", "minmax", "expression", "expression-condition"])
def test_normalizers(feature_set, normalizer, values, want):
    fs = feature_set(_raw(f'normalizer: "{normalizer}"'))
    got = fs.parse(pa.table({"c": values})).dense["r"][:, 0].tolist()
    assert np.allclose(got, want)


def test_a_missing_cells_default_is_not_normalized(feature_set):
    # as in TorchEasyRec: the normalizer applies to the values read, not to default_value
    fs = feature_set(_raw('default_value: "0.01" '
                          'normalizer: "method=log10,threshold=0.05,default=-5"'))
    got = fs.parse(pa.table({"c": ["0.1", "", "10", None]})).dense["r"][:, 0].tolist()
    assert np.allclose(got, [-1.0, 0.01, 1.0, 0.01])
    pair = feature_set(_raw('value_dim: 2 separator: "," default_value: "0.1,0.4" '
                            'normalizer: "method=minmax,min=0,max=0.5"'))
    got = pair.parse(pa.table({"c": ["0.2,0.3", None]})).dense["r"].tolist()
    assert np.allclose(got, [[0.4, 0.6], [0.1, 0.4]])


def test_an_empty_list_cell_takes_the_default(feature_set):
    # as in TorchEasyRec (its raw_feature_test with boundaries): an empty list is missing
    fs = feature_set(_raw('boundaries: [0.05, 0.15, 0.25] value_dim: 2 separator: "," '
                          'default_value: "0.1,0.4" embedding_dim: 4'))
    cells = pa.array([["0.2", "0.5"], [], ["0.3", "0.6"]], pa.list_(pa.string()))
    ids = fs.parse(pa.table({"c": cells})).sparse["r"]
    assert ids.values.tolist() == [2, 3, 1, 3, 3, 3] and ids.lengths.tolist() == [2, 2, 2]


def test_boundaries_bucketize(feature_set):
    fs = feature_set(_raw("boundaries: [1, 2, 5] embedding_dim: 8"))
    batch = fs.parse(pa.table({"c": [0.5, 1.0, 4.9, 5.0, 100.0]}))
    assert batch.sparse["r"].values.tolist() == [0, 1, 2, 3, 3]
    assert fs.embedding_tables()[0].num_rows == 4
    assert fs.output_dim("r") == 8
    assert fs.dense_features() == {}


@pytest.mark.parametrize("options, message", [
    ("boundaries: [3, 1] embedding_dim: 4", "ascending"),
    ("boundaries: [1, 2]", "embedding_dim must be > 0"),
    ('normalizer: "method=expression,expr=foo(x)"', "unknown function 'foo'"),
    ('normalizer: "method=zscore,mean=1"', "needs"),
    ("value_dim: 0", "value_dim must be >= 1"),
], ids=["unsorted", "no-dim", "expression", "zscore-missing", "zero-dim"])
def test_config_errors(feature_set, options, message):
    with pytest.raises(ConfigError, match=message):
        feature_set(_raw(options))


def test_value_equal_to_a_decimal_boundary_is_in_the_bucket_above(feature_set):
    # boundaries are float32 in the config; 0.1 must still bucket like 0.1
    fs = feature_set(_raw("boundaries: [0.1, 0.2, 0.3] embedding_dim: 4"))
    values = [0.1, 0.2, 0.3, 0.15, 0.0999999, 0.3000001]
    assert fs.parse(pa.table({"c": values})).sparse["r"].values.tolist() == [1, 2, 3, 1, 0, 3]
    strings = fs.parse(pa.table({"c": ["0.1", "0.3"]}))
    assert strings.sparse["r"].values.tolist() == [1, 3]


@pytest.mark.parametrize("boundaries, message", [
    ("[1, 1, 2]", r"got 1 after 1 in \['1', '1', '2'\]"),
    ("[0.5, 2, 1.5]", r"got 1.5 after 2 in \['0.5', '2', '1.5'\]"),
], ids=["duplicate", "unsorted"])
def test_boundaries_must_strictly_increase(feature_set, boundaries, message):
    with pytest.raises(ConfigError, match=rf"'r': boundaries must be strictly ascending, {message}"):
        feature_set(_raw(f"boundaries: {boundaries} embedding_dim: 4"))


@pytest.mark.parametrize("normalizer, message", [
    ("method=zscore,mean=1,standard_deviation=0", r"bad standard_deviation \(must be > 0\)"),
    ("method=minmax,min=2,max=2", r"bad max \(must be > min\)"),
    ("method=minmax,min=3,max=2", r"bad max \(must be > min\)"),
    ("method=zscore,mean=inf,standard_deviation=1", "bad mean"),
    ("method=log10,threshhold=1", r"\['threshhold'\] are not parameters of log10"),
], ids=["zero-std", "min-eq-max", "min-gt-max", "inf-mean", "misspelt"])
def test_normalizer_that_would_give_nan_or_ignore_a_key_is_refused(feature_set, normalizer,
                                                                    message):
    with pytest.raises(ConfigError, match=rf"'r': normalizer '{normalizer}': {message}"):
        feature_set(_raw(f'normalizer: "{normalizer}"'))


def test_normalizer_allows_spaces_around_parameters(feature_set):
    fs = feature_set(_raw('normalizer: "method=zscore, mean = 1, standard_deviation=2"'))
    assert fs.parse(pa.table({"c": [5.0]})).dense["r"].tolist() == [[2.0]]


def test_value_dim_list_column_takes_its_default_for_null_cells(feature_set):
    fs = feature_set(_raw('value_dim: 2 separator: "," default_value: "0,-1"'))
    lists = pa.array([[1.0, 2.0], None], pa.list_(pa.float64()))
    assert fs.parse(pa.table({"c": lists})).dense["r"].tolist() == [[1, 2], [0, -1]]


@pytest.mark.parametrize("options, want", [("", [[0.0]] * 3),
                                           ('default_value: "2.5"', [[2.5]] * 3)],
                         ids=["config-default", "default"])
def test_a_list_column_of_nulls_takes_the_default(feature_set, options, want):
    # pyarrow infers list<null> for a column whose lists are all empty or null
    column = pa.array([[], None, []], pa.list_(pa.null()))
    assert feature_set(_raw(options)).parse(pa.table({"c": column})).dense["r"].tolist() == want
    bucketized = feature_set(_raw(f"{options} boundaries: [1.0] embedding_dim: 4"))
    assert bucketized.parse(pa.table({"c": column})).sparse["r"].values.tolist() == \
        [int(row[0] >= 1.0) for row in want]


def test_an_expression_normalizes_each_value_and_not_the_default(feature_set):
    fs = feature_set(_raw('value_dim: 2 separator: "," default_value: "-3,0" '
                          'normalizer: "method=expression,expr=log(x+3)"'))
    got = fs.parse(pa.table({"c": ["-2,1", None, "0,5"]})).dense["r"].tolist()
    # the default -3 would be log(0), -inf: it is taken as it is, as TorchEasyRec does
    assert np.allclose(got, [[0.0, math.log(4)], [-3.0, 0.0], [math.log(3), math.log(8)]])


def test_an_expression_normalizes_before_bucketizing(feature_set):
    fs = feature_set(_raw('boundaries: [1, 2] embedding_dim: 4 '
                          'normalizer: "method=expression,expr=log10(x)"'))
    ids = fs.parse(pa.table({"c": [5.0, 10.0, 99.0, 100.0, 1e300]})).sparse["r"]
    assert ids.values.tolist() == [0, 1, 1, 2, 2]


def test_an_expression_normalizes_a_sequence(feature_set):
    fs = feature_set('feature_configs { sequence_raw_feature { feature_name: "s" '
                     'expression: "user:s" sequence_length: 3 sequence_delim: ";" '
                     'normalizer: "method=expression,expr=2*x^2" } }')
    got = fs.parse(pa.table({"s": ["1;-2", "3"]})).sequence_dense["s"][:, :, 0].tolist()
    assert got == [[2.0, 8.0, 0.0], [18.0, 0.0, 0.0]]


@pytest.mark.parametrize("normalizer, values, message", [
    ("method=expression,expr=log(x+3)", [1.0, -3.0], r"value -3 becomes -inf"),
    ("method=expression,expr=log(x)", [1.0, -1.0], r"value -1 becomes nan"),
    ("method=expression,expr=1/x", [1.0, 0.0], r"value 0 becomes inf"),
    ("method=expression,expr=exp(x)", [1.0, 100.0],
     r"value 100 becomes 2.68812e\+43"),
    ("method=zscore,mean=0,standard_deviation=1e-300", [0.0, 1e10], r"value 1e\+10 becomes inf"),
], ids=["log-zero", "log-negative", "divide-by-zero", "float32-overflow", "zscore-overflow"])
def test_a_value_the_normalizer_makes_not_finite_names_the_row(feature_set, normalizer, values,
                                                               message):
    fix = r"check the normalizer's parameters, or clean the input$" if "zscore" in normalizer \
        else r"make the expression finite for every value the column holds \(e.g. x > 0 \? "
    fs = feature_set(_raw(f'normalizer: "{normalizer}"'))
    with pytest.raises(FeatureError, match=rf"^feature 'r': column 'c' row 1: {message} under "
                                           rf"normalizer '{re.escape(normalizer)}', which is "
                                           rf"not finite or beyond float32's range; {fix}"):
        fs.parse(pa.table({"c": values}))


def test_a_bucketized_value_may_exceed_float32_but_not_be_infinite(feature_set):
    fs = feature_set(_raw('boundaries: [1] embedding_dim: 4 '
                          'normalizer: "method=expression,expr=exp(x)"'))
    assert fs.parse(pa.table({"c": [-1.0, 100.0]})).sparse["r"].values.tolist() == [0, 1]
    with pytest.raises(FeatureError, match="row 0: value 1000 becomes inf"):
        fs.parse(pa.table({"c": [1000.0]}))
