"""A feature's ``init_fn`` (TorchEasyRec's embedding initializer) as InitializerArgs.

``init_fn`` names a ``torch.nn.init`` function and its keyword arguments, separated by
commas: ``"nn.init.uniform_,a=-0.01,b=0.01"``. HashRec draws rows itself (dense tables
at start, dynamic tables as keys arrive), so it reads the text instead of calling the
function, and accepts the functions whose draw it implements:

* ``uniform_`` (a=0, b=1): UNIFORM in [a, b];
* ``normal_`` (mean=0, std=1): NORMAL;
* ``trunc_normal_`` (mean=0, std=1, a=-2, b=2): TRUNCATED_NORMAL cut at a and b, or
  NORMAL where a and b lie 6 std or more from the mean (torch's defaults with std 0.02,
  say: a cut no float32 draw shows);
* ``constant_`` (val), ``zeros_``, ``ones_``: CONSTANT.

Anything else (fan-based initializers, positional arguments, unknown keywords) is a
ConfigError naming the feature.
"""

from __future__ import annotations

import math

from hashrec.config.errors import ConfigError
from hashrec.table.options import InitializerArgs

# function -> its keyword arguments and their defaults (None: required).
_FUNCTIONS: dict[str, dict[str, float | None]] = {
    "uniform_": {"a": 0.0, "b": 1.0},
    "normal_": {"mean": 0.0, "std": 1.0},
    "trunc_normal_": {"mean": 0.0, "std": 1.0, "a": -2.0, "b": 2.0},
    "constant_": {"val": None},
    "zeros_": {},
    "ones_": {},
}
_PREFIXES = ("torch.nn.init.", "nn.init.")
# A truncated normal cut this many std or more from its mean draws as a normal one.
_UNCUT = 6.0


def init_fn_of(cfg, feature: str) -> InitializerArgs | None:
    """The InitializerArgs of a feature config's ``init_fn``, or None when it sets none."""
    return parse_init_fn(cfg.init_fn, f"feature {feature!r}: init_fn") if cfg.init_fn else None


def parse_init_fn(text: str, where: str) -> InitializerArgs:
    """An init function's text -> InitializerArgs (see the module docstring); ``where``
    names the setting in messages (``feature 'f': init_fn``,
    ``model_config.deepfm.wide_init_fn``).

    Raises:
        ConfigError: a function HashRec does not draw, or arguments it cannot read.
    """
    parts = [p.strip() for p in text.split(",")]
    name = parts[0]
    for prefix in _PREFIXES:
        name = name.removeprefix(prefix)
    if name not in _FUNCTIONS:
        raise ConfigError(
            f"{where} {text!r}: {parts[0]!r} is not supported; allowed: "
            f"{', '.join('nn.init.' + f for f in _FUNCTIONS)} (or dynamicemb "
            f"initializer_args for dynamic tables)")
    args = dict(_FUNCTIONS[name])
    for part in parts[1:]:
        key, sep, value = part.partition("=")
        key = key.strip()
        if not sep or key not in args:
            raise ConfigError(
                f"{where} {text!r}: {part!r} is not a keyword argument "
                f"of {name} (allowed: {', '.join(args) or 'none'}; write key=value)")
        try:
            args[key] = float(value)
        except ValueError:
            raise ConfigError(f"{where} {text!r}: {key}={value.strip()!r} "
                              f"is not a number") from None
        if not math.isfinite(args[key]):
            raise ConfigError(f"{where} {text!r}: {key} must be finite")
    missing = [k for k, v in args.items() if v is None]
    if missing:
        raise ConfigError(f"{where} {text!r}: {name} needs "
                          f"{', '.join(k + '=...' for k in missing)}")
    try:
        return _initializer(name, args)
    except ValueError as err:
        raise ConfigError(f"{where} {text!r}: {err}") from None


def _initializer(name: str, args: dict[str, float]) -> InitializerArgs:
    if name == "uniform_":
        return InitializerArgs(mode="UNIFORM", lower=args["a"], upper=args["b"])
    if name == "normal_":
        return InitializerArgs(mode="NORMAL", mean=args["mean"], std_dev=args["std"])
    if name == "trunc_normal_":
        mean, std, a, b = args["mean"], args["std"], args["a"], args["b"]
        cut = (mean - 2 * std, mean + 2 * std)
        if all(math.isclose(x, y, rel_tol=1e-6, abs_tol=1e-12) for x, y in zip((a, b), cut)):
            return InitializerArgs(mode="TRUNCATED_NORMAL", mean=mean, std_dev=std)
        if a <= mean - _UNCUT * std and b >= mean + _UNCUT * std:
            # a cut this far out (torch's defaults -2 and 2 for a small std) changes no
            # draw a float32 row would tell apart from a normal one
            return InitializerArgs(mode="NORMAL", mean=mean, std_dev=std)
        if not a < b:
            raise ValueError(f"a={a:g} must be below b={b:g}")
        return InitializerArgs(mode="TRUNCATED_NORMAL", mean=mean, std_dev=std, lower=a,
                               upper=b)
    value = {"zeros_": 0.0, "ones_": 1.0}.get(name, args.get("val"))
    return InitializerArgs(mode="CONSTANT", value=value)
