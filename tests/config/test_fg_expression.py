"""The normalizer expression language: values against hand-computed ones, precedence as
muParser's (which the feature generation uses), and a clear refusal of everything else."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from hashrec.config import ConfigError
from hashrec.config.fg_expression import FUNCTIONS, REFUSED_FUNCTIONS, Expression

X = np.array([-2.0, 0.0, 1.0, 2.5])


def _eval(text: str, x=X) -> list[float]:
    return Expression.parse(text, "test")(np.asarray(x, dtype=np.float64)).tolist()


@pytest.mark.parametrize("text, want", [
    ("log(x+3)", [0.0, math.log(3), math.log(4), math.log(5.5)]),
    ("1+2*3-4/2", [5.0] * 4),                  # * and / before + and -
    ("2*x^2", [8.0, 0.0, 2.0, 12.5]),          # ^ before *
    ("2^3^2", [512.0] * 4),                    # ^ is right-associative: 2^(3^2)
    ("(2^3)^2", [64.0] * 4),
    ("10-4-3", [3.0] * 4),                     # - is left-associative
    ("8/4/2", [1.0] * 4),
    ("-x^2", [-4.0, -0.0, -1.0, -6.25]),       # a sign binds looser than ^
    ("(-x)^2", [4.0, 0.0, 1.0, 6.25]),
    ("-x*3", [6.0, -0.0, -3.0, -7.5]),
    ("--x", [-2.0, 0.0, 1.0, 2.5]),
    ("+x-1", [-3.0, -1.0, 0.0, 1.5]),
    ("2^-1", [0.5] * 4),
    ("x - -1", [-1.0, 1.0, 2.0, 3.5]),
    ("1.5e1 + .5 - 2E-1", [15.3] * 4),
    ("sqrt(abs(x)+exp(0))", [math.sqrt(3), 1.0, math.sqrt(2), math.sqrt(3.5)]),
    ("log10(max(x,1)*100)", [2.0, 2.0, 2.0, 2.0 + math.log10(2.5)]),
    ("max(min(x, 1), -1)", [-1.0, 0.0, 1.0, 1.0]),
    ("x > 0 ? log2(x*4) : -1", [-1.0, -1.0, 2.0, math.log2(10)]),
    ("x > 0 ? x > 1 ? 2 : 1 : 0", [0.0, 0.0, 1.0, 2.0]),  # ?: nests to the right
    ("x >= 1 || x == -2", [1.0, 0.0, 1.0, 1.0]),
    ("x > -3 && x < 1", [1.0, 1.0, 0.0, 0.0]),
    ("1 + (x != 0)", [2.0, 1.0, 2.0, 2.0]),
    ("x < 1 == 1", [1.0, 1.0, 0.0, 0.0]),       # comparisons chain left to right
    ("_pi*_e", [math.pi * math.e] * 4),
    ("3", [3.0] * 4),
], ids=lambda v: v if isinstance(v, str) else None)
def test_values_and_precedence(text, want):
    assert np.allclose(_eval(text), want)


@pytest.mark.parametrize("text, x, want", [
    ("sin(x)", [0.5], [math.sin(0.5)]), ("cos(x)", [0.5], [math.cos(0.5)]),
    ("tan(x)", [0.5], [math.tan(0.5)]), ("asin(x)", [0.5], [math.asin(0.5)]),
    ("acos(x)", [0.5], [math.acos(0.5)]), ("atan(x)", [0.5], [math.atan(0.5)]),
    ("sinh(x)", [0.5], [math.sinh(0.5)]), ("cosh(x)", [0.5], [math.cosh(0.5)]),
    ("tanh(x)", [0.5], [math.tanh(0.5)]), ("asinh(x)", [0.5], [math.asinh(0.5)]),
    ("acosh(x)", [2.0], [math.acosh(2.0)]), ("atanh(x)", [0.5], [math.atanh(0.5)]),
    ("log(x)", [math.e], [1.0]), ("ln(x)", [math.e ** 2], [2.0]),
    ("log2(x)", [8.0], [3.0]), ("log10(x)", [1000.0], [3.0]), ("exp(x)", [1.0], [math.e]),
    ("sqrt(x)", [9.0], [3.0]), ("abs(x)", [-1.5, 2.0], [1.5, 2.0]),
    ("sign(x)", [-3.0, 0.0, 0.2], [-1.0, 0.0, 1.0]),
    ("rint(x)", [2.5, -2.5, 1.4], [3.0, -2.0, 1.0]),        # halves up: floor(x + 0.5)
    ("floor(x)", [-1.5, 1.5], [-2.0, 1.0]), ("ceil(x)", [-1.5, 1.5], [-1.0, 2.0]),
    ("trunc(x)", [-1.7, 1.7], [-1.0, 1.0]),
    ("round(x)", [2.5, -2.5, 0.4], [3.0, -3.0, 0.0]),      # halves away from zero
    ("roundp(x, 2)", [3.14159, -2.675], [3.14, -2.68]),
    ("sigmoid(x)", [0.0, 2.0], [0.5, 1 / (1 + math.exp(-2))]),
    ("min(x, 3, 1)", [2.0, 0.5], [1.0, 0.5]), ("max(x, 3, 1)", [2.0, 5.0], [3.0, 5.0]),
    ("sum(x, 1, 2)", [2.0], [5.0]), ("avg(x, 1, 2)", [3.0], [2.0]), ("max(x)", [4.0], [4.0]),
], ids=lambda v: v if isinstance(v, str) else None)
def test_each_function(text, x, want):
    assert np.allclose(_eval(text, x), want)


def test_every_function_is_tested_above():
    tested = {text.split("(")[0] for text in (
        "sin cos tan asin acos atan sinh cosh tanh asinh acosh atanh log ln log2 log10 exp "
        "sqrt abs sign rint floor ceil trunc round roundp sigmoid min max sum avg").split()}
    assert tested == set(FUNCTIONS)
    assert not set(FUNCTIONS) & set(REFUSED_FUNCTIONS)


def test_bad_values_come_out_as_nan_or_inf_for_the_caller_to_refuse():
    out = _eval("log(x)", [-1.0, 0.0, 1.0])
    assert math.isnan(out[0]) and out[1] == -math.inf and out[2] == 0.0
    assert _eval("1/x", [0.0]) == [math.inf]
    # the branch not taken may be NaN: only the chosen one counts
    assert _eval("x > 0 ? log(x) : 0", [-1.0, 0.0, math.e]) == [0.0, 0.0, 1.0]


def test_the_output_has_the_input_shape_and_float64():
    expr = Expression.parse("2", "test")
    out = expr(np.zeros((0,)))
    assert out.shape == (0,) and out.dtype == np.float64
    assert expr(np.array([1, 2], dtype=np.int64)).tolist() == [2.0, 2.0]


@pytest.mark.parametrize("text, message", [
    ("", "it is empty; write an expression of x"),
    ("   ", "it is empty"),
    ("foo(x)", r"unknown function 'foo' \(at position 0\); supported: sin, cos, "),
    ("y + 1", r"unknown name 'y' \(at position 0\); the value is x, the constants are _pi, "
              r"_e$"),
    ("X", "unknown name 'X'"),
    ("log x", r"function 'log' \(at position 0\) needs its argument in parentheses, e.g. "
              r"log\(x\)"),
    ("rnd()", "function 'rnd' .* is not supported in a normalizer: it draws a random number"),
    ("haversine(x, 1, 2, 3)", "function 'haversine' .* takes two map points"),
    ("sphere_dist(x, 1, 2, 3)", "function 'sphere_dist' .* takes two map points"),
    ("l2_norm(x)", "function 'l2_norm' .* works on a vector, and a normalizer maps one "
                   "value at a time"),
    ("x**2", r"unexpected '\*\*' \(at position 1\): expected an operator or the end; write "
             r"a power as x\^2"),
    ("x = 1", "unexpected '=' .*compare with =="),
    ("!x", "unexpected '!' .*write x == 0"),
    ("x % 2", "unexpected '%' .*no remainder operator"),
    ("x | 1", r"unexpected '\|' .*bitwise \| is not supported; \|\| is the logical or"),
    ("x & 1", "unexpected '&' .*bitwise & is not supported; && is the logical and"),
    ("x $ 1", r"character '\$' \(at position 2\) is not part of the expression syntax"),
    ("x; 1", "character ';'"),
    ("'x'", "character \"'\""),
    ("log(x", r"it ends early: expected '\)'"),
    ("x +", "it ends early: expected a number, x, a function or"),
    ("x ? 1", "it ends early: expected ':'"),
    ("(x))", r"unexpected '\)' \(at position 3\): expected an operator or the end"),
    ("1 2", "unexpected '2' .*expected an operator or the end"),
    ("x * / 2", "unexpected '/' .*expected a number"),
    ("roundp(x)", "function 'roundp' .* takes 2 arguments, got 1"),
    ("log(x, 2)", "function 'log' .* takes 1 argument, got 2"),
    ("max()", "function 'max' .* takes one or more arguments, got 0"),
    ("__import__(x)", "unknown function '__import__'"),
], ids=lambda v: v if isinstance(v, str) and len(v) < 25 else None)
def test_refusals_name_the_place_the_expression_and_the_part(text, message):
    with pytest.raises(ConfigError, match=rf"^feature 'f': normalizer 'n': expression "
                                          rf"{re.escape(repr(text))}: {message}"):
        Expression.parse(text, "feature 'f': normalizer 'n'")

