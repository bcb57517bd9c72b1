"""A raw feature's ``normalizer``: the feature generation's transform of each value.

``method=log10,threshold=..,default=..`` | ``method=zscore,mean=..,standard_deviation=..``
| ``method=minmax,min=..,max=..`` | ``method=expression,expr=..`` (``fg_expression``).
Parsed when the config is validated, so a bad one stops a run before any data is read,
and again when the feature is built.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from hashrec.config.errors import ConfigError
from hashrec.config.fg_expression import Expression

# method -> (parameters it needs, parameters it may have)
_PARAMETERS = {
    "log10": ((), ("threshold", "default")),
    "zscore": (("mean", "standard_deviation"), ("mean", "standard_deviation")),
    "minmax": (("min", "max"), ("min", "max")),
    "expression": (("expr",), ("expr",)),
}
METHODS = tuple(_PARAMETERS)


def _items(text: str, where: str) -> dict[str, str]:
    """``key=value`` items separated by commas outside parentheses (an expression's
    ``max(x,0)`` keeps its comma)."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        depth += {"(": 1, ")": -1}.get(char, 0)
        if char == "," and depth <= 0:
            parts.append(text[start:i])
            start = i + 1
    parts.append(text[start:])
    items: dict[str, str] = {}
    for part in filter(str.strip, parts):  # a stray comma adds an empty part: skipped
        key, equals, value = part.partition("=")
        key = key.strip()
        if not equals or not key:
            raise ConfigError(f"{where}: {part.strip()!r} is not a key=value item; write e.g. "
                              f"method=zscore,mean=0,standard_deviation=1")
        if key in items:
            raise ConfigError(f"{where}: {key} is given twice")
        items[key] = value.strip()
    return items


@dataclass(frozen=True)
class Normalizer:
    """The parsed ``normalizer`` text of a feature; called on float64 values."""

    text: str
    method: str
    params: tuple[tuple[str, float], ...] = ()
    expression: Expression | None = None

    @classmethod
    def parse(cls, text: str, feature: str) -> Normalizer:
        """Raises ConfigError naming ``feature``, the text and the part at fault."""
        where = f"feature {feature!r}: normalizer {text!r}"
        items = _items(text, where)
        method = items.pop("method", "")
        if method not in _PARAMETERS:
            raise ConfigError(f"{where}: method must be one of {', '.join(METHODS)}, got "
                              f"{method!r}")
        needed, allowed = _PARAMETERS[method]
        unknown = sorted(set(items) - set(allowed))
        if unknown:
            raise ConfigError(f"{where}: {unknown} are not parameters of {method}; allowed: "
                              f"{list(allowed)}")
        missing = [k for k in needed if k not in items]
        if missing:
            raise ConfigError(f"{where}: {method} needs {missing}")
        if method == "expression":
            return cls(text, method, (), Expression.parse(items["expr"], where))
        params = {}
        for key, value in items.items():
            try:
                params[key] = float(value)
            except ValueError:
                raise ConfigError(f"{where}: {key}={value!r} is not a number") from None
        _check_params(method, params, where)
        return cls(text, method, tuple(sorted(params.items())))

    def __call__(self, x: np.ndarray) -> np.ndarray:
        """float64 values normalized; NaN or infinities that come out (``log(0)`` of an
        expression, an overflow) are the caller's to refuse."""
        if self.expression is not None:
            return self.expression(x)
        p = dict(self.params)
        with np.errstate(all="ignore"):
            if self.method == "log10":
                threshold, default = p.get("threshold", 1e-10), p.get("default", -10.0)
                return np.where(x > threshold, np.log10(np.maximum(x, threshold)), default)
            if self.method == "zscore":
                return (x - p["mean"]) / p["standard_deviation"]
            return (x - p["min"]) / (p["max"] - p["min"])


def _check_params(method: str, params: dict[str, float], where: str) -> None:
    bad = [k for k, v in params.items() if not math.isfinite(v)]
    if method == "zscore" and params["standard_deviation"] <= 0:
        bad.append("standard_deviation (must be > 0)")
    if method == "minmax" and params["max"] <= params["min"]:
        bad.append("max (must be > min)")
    if bad:
        raise ConfigError(f"{where}: bad {', '.join(bad)}; it would turn values into NaN or "
                          f"inf")
