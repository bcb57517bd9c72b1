"""The expression of a raw feature's ``method=expression`` normalizer, e.g. ``log(x+3)``.

A feature generation evaluates these with muParser's syntax (TorchEasyRec documents it
under ExprFeature), and so does this module, on numpy arrays, without ``eval``:

- the variable ``x`` (the value being normalized), number literals (``3``, ``.5``,
  ``1e-3``) and the constants ``_pi`` and ``_e``;
- binary operators, loosest first: ``||``; ``&&``; comparisons ``< <= > >= == !=``;
  ``+ -``; ``* /``; ``^`` (power, right-associative: ``2^3^2`` is ``2^9``). A sign binds
  looser than ``^``: ``-x^2`` is ``-(x^2)``. Comparisons and logic give 1 or 0, and any
  value other than 0 counts as true;
- ``cond ? a : b`` (loosest of all), parentheses;
- the functions of ``FUNCTIONS``. ``rint`` rounds halves up (muParser's ``floor(v+0.5)``),
  ``round`` rounds them away from zero, ``roundp(v, p)`` rounds to ``p`` decimals as
  ``round`` does, ``sign(0)`` is 0, ``log`` and ``ln`` are the natural logarithm.

What a normalizer cannot use is refused when the config is validated: the random
``rnd``, the four-argument distances between map points, the vector functions (the
normalizer maps one value at a time), the bitwise ``|`` and ``&``, other names.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from hashrec.config.errors import ConfigError


def _round_half_away(v: np.ndarray) -> np.ndarray:
    return np.sign(v) * np.floor(np.abs(v) + 0.5)


def _roundp(v: np.ndarray, places: np.ndarray) -> np.ndarray:
    scale = np.power(10.0, places)
    return _round_half_away(v * scale) / scale


# name -> (number of arguments, None: one or more; the numpy function of them)
FUNCTIONS: dict[str, tuple[int | None, Callable[..., np.ndarray]]] = {
    "sin": (1, np.sin), "cos": (1, np.cos), "tan": (1, np.tan),
    "asin": (1, np.arcsin), "acos": (1, np.arccos), "atan": (1, np.arctan),
    "sinh": (1, np.sinh), "cosh": (1, np.cosh), "tanh": (1, np.tanh),
    "asinh": (1, np.arcsinh), "acosh": (1, np.arccosh), "atanh": (1, np.arctanh),
    "log": (1, np.log), "ln": (1, np.log), "log2": (1, np.log2), "log10": (1, np.log10),
    "exp": (1, np.exp), "sqrt": (1, np.sqrt), "abs": (1, np.abs), "sign": (1, np.sign),
    "rint": (1, lambda v: np.floor(v + 0.5)), "floor": (1, np.floor), "ceil": (1, np.ceil),
    "trunc": (1, np.trunc), "round": (1, _round_half_away), "roundp": (2, _roundp),
    "sigmoid": (1, lambda v: 1.0 / (1.0 + np.exp(-v))),
    "min": (None, lambda *a: np.minimum.reduce(np.broadcast_arrays(*a))),
    "max": (None, lambda *a: np.maximum.reduce(np.broadcast_arrays(*a))),
    "sum": (None, lambda *a: np.add.reduce(np.broadcast_arrays(*a))),
    "avg": (None, lambda *a: np.add.reduce(np.broadcast_arrays(*a)) / len(a)),
}
# Functions of the feature generation's expressions that a normalizer refuses, and why.
REFUSED_FUNCTIONS = {
    "rnd": "draws a random number, so training, evaluation and prediction would each see "
           "other values",
    "sphere_dist": "takes two map points (4 values), and a normalizer has one value, x",
    "haversine": "takes two map points (4 values), and a normalizer has one value, x",
    **{name: "works on a vector, and a normalizer maps one value at a time"
       for name in ("len", "l2_norm", "squared_norm", "dot", "euclid_dist", "std_dev",
                    "pop_std_dev", "variance", "pop_variance", "reduce_min", "reduce_max",
                    "reduce_sum", "reduce_mean", "reduce_prod")},
}
CONSTANTS = {"_pi": math.pi, "_e": math.e}
VARIABLE = "x"
# binary operator -> precedence (higher binds tighter)
_BINARY = {"||": 1, "&&": 2, "<": 5, "<=": 5, ">": 5, ">=": 5, "==": 5, "!=": 5,
           "+": 6, "-": 6, "*": 7, "/": 7, "^": 8}
_SIGN_OPERAND = 8  # a sign's operand takes in ^ only (muParser: signs bind looser than ^)
_TOKEN = re.compile(r"\s*(?:(?P<number>(?:\d+\.?\d*|\.\d+)(?:[eE][+-]?\d+)?)"
                    r"|(?P<name>[A-Za-z_][A-Za-z0-9_]*)"
                    r"|(?P<op>\|\||&&|<=|>=|==|!=|\*\*|[-+*/^<>?:(),|&=!%]))")
_HINTS = {"**": "write a power as x^2", "=": "compare with ==", "!": "write x == 0 for 'not x'",
          "%": "there is no remainder operator", "|": "bitwise | is not supported; || is "
          "the logical or", "&": "bitwise & is not supported; && is the logical and"}


def _logical(v: np.ndarray) -> np.ndarray:
    return np.asarray(v) != 0


_APPLY: dict[str, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    "+": np.add, "-": np.subtract, "*": np.multiply, "/": np.true_divide, "^": np.power,
    "<": np.less, "<=": np.less_equal, ">": np.greater, ">=": np.greater_equal,
    "==": np.equal, "!=": np.not_equal,
    "&&": lambda a, b: _logical(a) & _logical(b), "||": lambda a, b: _logical(a) | _logical(b),
}


@dataclass(frozen=True)
class Number:
    value: float

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(self.value, dtype=np.float64)


@dataclass(frozen=True)
class Variable:
    def __call__(self, x: np.ndarray) -> np.ndarray:
        return x


@dataclass(frozen=True)
class Sign:
    op: str
    operand: Node

    def __call__(self, x: np.ndarray) -> np.ndarray:
        value = self.operand(x)
        return -value if self.op == "-" else value


@dataclass(frozen=True)
class Binary:
    op: str
    left: Node
    right: Node

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(_APPLY[self.op](self.left(x), self.right(x)), dtype=np.float64)


@dataclass(frozen=True)
class Condition:
    test: Node
    then: Node
    otherwise: Node

    def __call__(self, x: np.ndarray) -> np.ndarray:
        # both branches are computed for every value; the one not taken may hold NaN
        return np.where(_logical(self.test(x)), self.then(x), self.otherwise(x))


@dataclass(frozen=True)
class Call:
    name: str
    args: tuple[Node, ...]

    def __call__(self, x: np.ndarray) -> np.ndarray:
        return np.asarray(FUNCTIONS[self.name][1](*(arg(x) for arg in self.args)),
                          dtype=np.float64)


Node = Number | Variable | Sign | Binary | Condition | Call


@dataclass(frozen=True)
class Expression:
    """A parsed expression of ``x``: ``Expression.parse("log(x+3)", where)(values)``."""

    text: str
    root: Node

    @classmethod
    def parse(cls, text: str, where: str) -> Expression:
        """Parse ``text``; ``where`` (e.g. ``feature 'a': normalizer '...'``) starts the
        message of the ConfigError that an unsupported or malformed part raises."""
        return cls(text, _Parser(text, where).parse())

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """float64 values of the expression for each value of ``x`` (same shape); NaN and
        infinities (``log(0)``, ``1/0``) are returned as they come, for the caller to judge."""
        x = np.asarray(x, dtype=np.float64)
        with np.errstate(all="ignore"):
            out = self.root(x)
        return np.broadcast_to(out, x.shape).astype(np.float64)


class _Parser:
    """Precedence climbing over the tokens of one expression."""

    def __init__(self, text: str, where: str) -> None:
        self.text = text
        self.where = f"{where}: expression {text!r}"
        self.tokens = self._tokenize(text)
        self.pos = 0

    def _error(self, problem: str) -> ConfigError:
        return ConfigError(f"{self.where}: {problem}")

    def _tokenize(self, text: str) -> list[tuple[str, str, int]]:
        """(kind, text, character position) of each token, then ("end", "", len)."""
        tokens, at = [], 0
        while text[at:].strip():
            match = _TOKEN.match(text, at)
            if match is None:
                char = text[at:].lstrip()[0]
                raise self._error(f"character {char!r} (at position {text.index(char, at)}) is not "
                                  f"part of the expression syntax")
            kind = match.lastgroup
            tokens.append((kind, match.group(kind), match.start(kind)))
            at = match.end()
        if not tokens:
            raise self._error("it is empty; write an expression of x, e.g. log(x+1)")
        return tokens + [("end", "", len(text))]

    def _peek(self) -> tuple[str, str, int]:
        return self.tokens[self.pos]

    def _take(self) -> tuple[str, str, int]:
        token = self.tokens[self.pos]
        self.pos += 1
        return token

    def _expect(self, op: str) -> None:
        kind, text, at = self._take()
        if (kind, text) != ("op", op):
            raise self._unexpected(kind, text, at, f"expected {op!r}")

    def _unexpected(self, kind: str, text: str, at: int, expected: str) -> ConfigError:
        if kind == "end":
            return self._error(f"it ends early: {expected}")
        hint = f"; {_HINTS[text]}" if kind == "op" and text in _HINTS else ""
        return self._error(f"unexpected {text!r} (at position {at}): {expected}{hint}")

    def parse(self) -> Node:
        root = self._condition()
        kind, text, at = self._peek()
        if kind != "end":
            raise self._unexpected(kind, text, at, "expected an operator or the end")
        return root

    def _condition(self) -> Node:
        test = self._binary(1)
        if self._peek()[:2] != ("op", "?"):
            return test
        self._take()
        then = self._condition()
        self._expect(":")
        return Condition(test, then, self._condition())

    def _binary(self, loosest: int) -> Node:
        left = self._operand()
        while True:
            kind, op, _ = self._peek()
            if kind != "op" or _BINARY.get(op, 0) < loosest:
                return left
            self._take()
            # ^ is right-associative: its right side takes in further ^
            tightest = _BINARY[op] if op == "^" else _BINARY[op] + 1
            left = Binary(op, left, self._binary(tightest))

    def _operand(self) -> Node:
        kind, text, at = self._take()
        if kind == "op" and text in ("-", "+"):
            return Sign(text, self._binary(_SIGN_OPERAND))
        if kind == "op" and text == "(":
            inner = self._condition()
            self._expect(")")
            return inner
        if kind == "number":
            return Number(float(text))
        if kind == "name":
            return self._name(text, at)
        raise self._unexpected(kind, text, at, "expected a number, x, a function or '('")

    def _name(self, name: str, at: int) -> Node:
        called = self._peek()[:2] == ("op", "(")
        if not called:
            if name == VARIABLE:
                return Variable()
            if name in CONSTANTS:
                return Number(CONSTANTS[name])
            if name in FUNCTIONS:
                raise self._error(f"function {name!r} (at position {at}) needs its argument in "
                                  f"parentheses, e.g. {name}(x)")
            raise self._error(f"unknown name {name!r} (at position {at}); the value is {VARIABLE}, "
                              f"the constants are {', '.join(CONSTANTS)}")
        if name in REFUSED_FUNCTIONS:
            raise self._error(f"function {name!r} (at position {at}) is not supported in a "
                              f"normalizer: it {REFUSED_FUNCTIONS[name]}")
        if name not in FUNCTIONS:
            raise self._error(f"unknown function {name!r} (at position {at}); supported: "
                              f"{', '.join(FUNCTIONS)}")
        self._take()
        args = [] if self._peek()[:2] == ("op", ")") else [self._condition()]
        while self._peek()[:2] == ("op", ","):
            self._take()
            args.append(self._condition())
        self._expect(")")
        count = FUNCTIONS[name][0]
        if (count is None and not args) or (count is not None and len(args) != count):
            want = "one or more arguments" if count is None else \
                f"{count} argument{'s' if count > 1 else ''}"
            raise self._error(f"function {name!r} (at position {at}) takes {want}, got {len(args)}")
        return Call(name, tuple(args))
