"""Command-line pieces shared by the table benchmarks.

No torch or Triton import here: a ``--smoke`` run must set ``TRITON_INTERPRET``
before Triton is imported.
"""

from __future__ import annotations

import argparse
import os


def add_out_and_smoke(p: argparse.ArgumentParser) -> None:
    """``--out`` (path prefix of the results) and ``--smoke`` (tiny, CPU)."""
    p.add_argument("--out", default=None, help="path prefix for .json and .md")
    p.add_argument("--smoke", action="store_true", help="tiny sizes on CPU (interpreter)")


def parse_with_smoke(p: argparse.ArgumentParser) -> argparse.Namespace:
    """Parses the command line; with ``--smoke``, Triton runs interpreted on the CPU."""
    args = p.parse_args()
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
    return args


def launch_config(text: str) -> dict:
    """A find launch written BLOCKxWARPS, optionally rREGS (at most REGS registers a
    thread), then optionally w (the probe by word, ``WORD_PROBE``), e.g. ``64x2r80w``, as
    ``FIND_CONFIG``'s dict."""
    launch, _, regs = text.removesuffix("w").partition("r")
    try:
        block, warps = (int(x) for x in launch.split("x"))
        return {"block": block, "num_warps": warps, "maxnreg": int(regs) if regs else 0,
                "by_word": text.endswith("w")}
    except ValueError:
        raise SystemExit(f"launch config {text!r} is not BLOCKxWARPS[rREGS][w], e.g. "
                         "64x2r80w") from None


def int_pairs(items: list[str]) -> dict[str, int]:
    """``NAME=VALUE`` items (constexprs to set or require) as a dict of integers."""
    out = {}
    for item in items:
        name, _, value = item.partition("=")
        try:
            out[name] = int(value)
        except ValueError:
            raise SystemExit(f"expected NAME=INTEGER, got {item!r}") from None
    return out
