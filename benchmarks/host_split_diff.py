"""Two ``host_split.py`` results side by side: where one step's host time differs.

Each function's inclusive milliseconds per step in A and in B and their difference,
largest first (operators per step too when both ran with ``--ops``). Typical use: a
1-GPU result against one rank of a 2-GPU result of the same host, or a result before
a change against one after it.

Usage::

    python benchmarks/host_split_diff.py A.json B.json [--out OUT/diff]
"""

from __future__ import annotations

import argparse
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from profile_train_step import report  # noqa: E402


def compare(a: dict, b: dict, names: tuple[str, str]) -> tuple[dict, str]:
    """(rows, markdown) of results ``a`` and ``b`` named ``names``."""
    def by_function(result: dict) -> dict:
        return {r["function"]: r for r in result["rows"]}

    ra, rb = by_function(a), by_function(b)
    ops = all("ops_per_step" in r for r in [*ra.values(), *rb.values()])
    rows = []
    for name in set(ra) | set(rb):
        ms = [r[name]["ms_per_step"] if name in r else 0.0 for r in (ra, rb)]
        row = {"function": name, "a_ms": ms[0], "b_ms": ms[1], "diff_ms": ms[1] - ms[0]}
        if ops:
            row["a_ops"], row["b_ops"] = (r[name]["ops_per_step"] if name in r else 0.0
                                          for r in (ra, rb))
        rows.append(row)
    rows.sort(key=lambda r: -max(r["a_ms"], r["b_ms"]))
    lines = [f"# Host time per function: {names[0]} (A) against {names[1]} (B)", "",
             f"A: {a['date']}, {a['device']}, {a['wall_ms_per_step']:.2f} ms/step wall, "
             f"`{a['command']}`", "",
             f"B: {b['date']}, {b['device']}, {b['wall_ms_per_step']:.2f} ms/step wall, "
             f"`{b['command']}`", "",
             "| function | A ms/step | B ms/step | B - A |" + (" A ops | B ops |" if ops else ""),
             "|---|---:|---:|---:|" + ("---:|---:|" if ops else "")]
    for r in rows:
        line = f"| `{r['function']}` | {r['a_ms']:.3f} | {r['b_ms']:.3f} | {r['diff_ms']:+.3f} |"
        if ops:
            line += f" {r['a_ops']:.1f} | {r['b_ops']:.1f} |"
        lines.append(line)
    return {"a": names[0], "b": names[1], "rows": rows}, "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("a", help="host_split result (.json)")
    p.add_argument("b", help="host_split result (.json)")
    p.add_argument("--out", default=None, help="path prefix of the .md and .json results")
    args = p.parse_args(argv)
    with open(args.a, encoding="utf-8") as fa, open(args.b, encoding="utf-8") as fb:
        result, text = compare(json.load(fa), json.load(fb),
                               (os.path.basename(args.a), os.path.basename(args.b)))
    report(result, text, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
