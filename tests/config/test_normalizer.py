"""A raw feature's normalizer text: its items, methods and parameters, and the refusals."""

from __future__ import annotations

import re

import numpy as np
import pytest

from hashrec.config import ConfigError
from hashrec.config.normalizer import Normalizer


@pytest.mark.parametrize("text, values, want", [
    ("method=expression,expr=log(x+3)", [-2.0, 1.0], [0.0, np.log(4.0)]),
    ("expr=log(x+3),method=expression", [-2.0], [0.0]),           # any order
    ("method=expression,expr=max(x,0)+min(x, 1)", [-1.0, 3.0], [-1.0, 4.0]),  # commas in ()
    ("method = expression , expr = x * 2 ", [1.5], [3.0]),
    ("method=expression,expr=x>=0?1:0", [-1.0, 0.0], [0.0, 1.0]),  # = inside the value
    ("method=log10,", [100.0], [2.0]),                              # a stray comma
], ids=["log", "order", "commas", "spaces", "equals", "stray-comma"])
def test_parse_and_apply(text, values, want):
    normalizer = Normalizer.parse(text, "f")
    assert np.allclose(normalizer(np.array(values)), want)
    assert normalizer.text == text


def test_an_expression_is_parsed_once_into_a_tree():
    normalizer = Normalizer.parse("method=expression,expr=log(x+3)", "f")
    assert normalizer.method == "expression" and normalizer.expression.text == "log(x+3)"
    assert type(normalizer.expression.root).__name__ == "Call"


@pytest.mark.parametrize("text, message", [
    ("method=expr,expr=x", "method must be one of log10, zscore, minmax, expression, got "
                           "'expr'"),
    ("expr=x", "method must be one of .*, got ''"),
    ("method=expression", r"expression needs \['expr'\]"),
    ("method=expression,expr=log(x),base=2", r"\['base'\] are not parameters of expression; "
                                             r"allowed: \['expr'\]"),
    ("method=expression,expr=lg(x)", "expression 'lg\\(x\\)': unknown function 'lg'"),
    ("method=expression,expr=", "expression '': it is empty"),
    ("method=zscore,mean=a,standard_deviation=1", "mean='a' is not a number"),
    ("method=zscore,mean=,standard_deviation=1", "mean='' is not a number"),
    ("method=log10,threshold", "'threshold' is not a key=value item; write e.g. "),
    ("method=minmax,min=0,max=1,min=2", "min is given twice"),
    ("method=log10,=1", "'=1' is not a key=value item"),
], ids=["method", "no-method", "no-expr", "expr-param", "bad-expr", "empty-expr",
        "not-number", "empty-number", "no-equals", "twice", "no-key"])
def test_refusals_name_feature_text_and_part(text, message):
    with pytest.raises(ConfigError, match=rf"^feature 'f': normalizer '{re.escape(text)}': "
                                          rf"{message}"):
        Normalizer.parse(text, "f")

