"""Whether a change to project kernels changes the code they compile to, without a GPU.

Compiles launches of the tests' launch log (``build/launches.jsonl``, which ``make
test`` writes: every interpreted kernel launch of the tests) for sm_90 in two trees,
the working tree and a base (a git revision, exported to a temporary folder, or a
folder), and compares their PTX instruction by instruction, register numbers, labels
and debug lines aside. Each launch reads:

- ``identical``: the same instructions in the same order;
- ``reordered``: the same instructions, some in another order (ptxas schedules the
  code itself, so a helper split out of a kernel that only moves an instruction
  compiles to the same work);
- ``changed``: instructions added or removed (counted), for a change that means to
  change the code, or one that should not have.

A kernel moved to another module is found by name in each tree. The exit status is 0
whatever the verdicts, and not 0 on an error (a kernel a tree lacks, a launch that
does not compile).

Example (a kernel split into helpers, against the last commit; then at benchmark A's
shape of the lane form, which the tests' small tables do not launch):

    python benchmarks/kernel_ptx_diff.py build/launches.jsonl --base HEAD \\
        --kernels upsert_lanes_kernel _finish_kernel
    python benchmarks/kernel_ptx_diff.py build/launches.jsonl --base HEAD \\
        --kernels upsert_lanes_kernel --set CAP=128 CAP_P2=128 LINE=32 BLOCK=32
"""

from __future__ import annotations

import argparse
import collections
import concurrent.futures
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _cli import int_pairs  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def instructions(ptx: str) -> list[str]:
    """The instructions of a PTX module, register numbers and labels replaced by their
    kind (``%r12`` -> ``%r``), debug sections and comments left out."""
    out = []
    for line in ptx.splitlines():
        text = line.split("//")[0].strip()
        if not re.match(r"[a-z@]", text):  # directives, labels, debug data
            continue
        text = re.sub(r"\$L__\w+", "$L", text)
        out.append(re.sub(r"(%[a-z]+)\d+", r"\1", text))
    return out


def verdict(base: list[str], new: list[str]) -> str:
    """``identical``, ``reordered`` or ``changed (+added -removed)`` (see the module
    docstring)."""
    if base == new:
        return "identical"
    a, b = collections.Counter(base), collections.Counter(new)
    if a == b:
        return "reordered"
    return f"changed (+{sum((b - a).values())} -{sum((a - b).values())})"


def _home(logged: str, name: str, kernels: set[tuple[str, str]]) -> str:
    """The module of this tree that holds kernel ``name`` logged in module ``logged``:
    that one if it still does, else the only module with a kernel of that name."""
    if (logged, name) in kernels:
        return logged
    homes = sorted(module for module, kernel in kernels if kernel == name)
    if len(homes) != 1:
        raise SystemExit(f"kernel_ptx_diff: {logged}.{name} is not in {os.getcwd()}, and "
                         f"{len(homes)} of its modules have a kernel of that name "
                         f"({', '.join(homes) or 'none'})")
    return homes[0]


def _compile_one(entry: dict) -> list[str] | None:
    """The instructions of one launch compiled for sm_90, None when it does not compile."""
    import triton
    from triton.backends.compiler import GPUTarget

    from tests import compile_check as cc
    try:
        source, options = cc._source(entry)
        ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
        return instructions(ptx.asm["ptx"])
    except Exception as err:  # noqa: BLE001 - reported as the launch's verdict
        print(f"{entry['module']}.{entry['kernel']}: {type(err).__name__}", file=sys.stderr)
        return None


def _dump(log: str, kernels: list[str], rewrite: dict[str, int], out: str, jobs: int) -> None:
    """In the tree on ``sys.path``: each launch of ``kernels`` compiled, with the
    constexprs of ``rewrite`` set where it has them, its instructions written to ``out``
    (JSON: launch as logged -> instructions, None where it does not compile)."""
    from tests import compile_check as cc
    here = cc._project_kernels()
    missing = [k for k in kernels if k not in {name for _, name in here}]
    if missing:
        raise SystemExit(f"kernel_ptx_diff: no kernel {', '.join(missing)} in {os.getcwd()}")
    with tempfile.NamedTemporaryFile("w", suffix=".jsonl", delete=False) as f:
        for line in open(log):  # compiled from the kernel's module here, keyed as logged
            entry = json.loads(line)
            if entry.get("kernel") in kernels:
                for name, value in rewrite.items():
                    if name in entry["kwargs"]:
                        entry["kwargs"][name] = ["value", value]
                home = _home(entry["module"], entry["kernel"], here)
                f.write(json.dumps({**entry, "module": home, "logged": entry["module"]}) + "\n")
    cc._PER_KERNEL = 1 << 30  # every distinct launch
    entries, _ = cc._entries(f.name)
    os.unlink(f.name)
    with concurrent.futures.ProcessPoolExecutor(max(1, jobs)) as pool:
        compiled = list(pool.map(_compile_one, entries))
    result = {}
    for entry, code in zip(entries, compiled):
        entry = {**entry, "module": entry["logged"]}
        del entry["logged"]
        result[json.dumps(entry, sort_keys=True)] = code
    with open(out, "w") as f:
        json.dump(result, f)


def _compiled(tree: str, log: str, kernels: list[str], rewrite: list[str], out: str,
              jobs: int) -> dict[str, list[str] | None]:
    """``_dump`` run in ``tree`` (its package and its tests' compile check)."""
    env = {k: v for k, v in os.environ.items()
           if k not in ("TRITON_INTERPRET", "HASHREC_FORCE_TRITON")}
    env["PYTHONPATH"] = tree
    done = subprocess.run([sys.executable, os.path.abspath(__file__), "--dump", out, log,
                           "--jobs", str(jobs), "--kernels", *kernels, "--set", *rewrite],
                          cwd=tree, env=env,
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"kernel_ptx_diff: compiling in {tree} failed:\n{done.stderr[-3000:]}")
    with open(out) as f:
        return json.load(f)


def _base_tree(base: str, into: str) -> str:
    """The base as a folder: itself, or the git revision exported into ``into``."""
    if os.path.isdir(base):
        return os.path.abspath(base)
    archive = subprocess.run(["git", "archive", base], cwd=ROOT, capture_output=True)
    if archive.returncode != 0:
        raise SystemExit(f"kernel_ptx_diff: no folder or git revision {base!r}: "
                         f"{archive.stderr.decode().strip()}")
    subprocess.run(["tar", "-x", "-C", into], input=archive.stdout, check=True)
    return into


def _varying(keys: list[str]) -> dict[str, set[str]]:
    """Per kernel, the constexprs whose value differs among its launches."""
    seen: dict[str, dict[str, set]] = {}
    for key in keys:
        entry = json.loads(key)
        for name, value in entry["kwargs"].items():
            seen.setdefault(f"{entry['module']}.{entry['kernel']}", {}).setdefault(name, set()).add(
                json.dumps(value[1]))
    return {k: {n for n, v in names.items() if len(v) > 1} for k, names in seen.items()}


def report(base: dict[str, list[str]], new: dict[str, list[str]], every: bool) -> list[str]:
    """Lines of the comparison: per kernel, its launches' verdicts counted, then the
    launches that are not identical (``every``: all of them) with the constexprs that
    tell them apart."""
    keys = sorted(set(base) | set(new))
    varying = _varying(keys)
    tally: dict[str, collections.Counter] = {}
    rows = []
    for key in keys:
        entry = json.loads(key)
        if key not in base or key not in new:
            what = "only in " + ("the working tree" if key in new else "the base")
            counts = str(len(new.get(key) or base.get(key) or []))
        elif base[key] is None or new[key] is None:
            what = "does not compile in " + ("either tree" if base[key] == new[key] else
                                             "the base" if base[key] is None else
                                             "the working tree")
            counts = "-"
        else:
            what = verdict(base[key], new[key])
            counts = f"{len(base[key])} / {len(new[key])}"
        kernel = f"{entry['module']}.{entry['kernel']}"
        tally.setdefault(kernel, collections.Counter())[what.split(" (")[0]] += 1
        if every or what != "identical":
            shown = " ".join(f"{n}={v[1]}" for n, v in sorted(entry["kwargs"].items())
                             if n in varying[kernel])
            rows.append(f"| {entry['kernel']} | {shown} | {counts} | {what} |")
    lines = [f"{kernel}: " + ", ".join(f"{n} {what}" for what, n in sorted(c.items()))
             for kernel, c in sorted(tally.items())]
    if rows:
        lines += ["", "| kernel | constexprs | instructions base / new | verdict |",
                  "| --- | --- | --- | --- |", *rows]
    return lines


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("log", help="launch log of the interpreted tests (build/launches.jsonl)")
    p.add_argument("--kernels", nargs="+", required=True, help="kernel names to compare")
    p.add_argument("--base", default="HEAD", help="git revision or folder to compare against "
                   "(default HEAD)")
    p.add_argument("--all", action="store_true", help="list identical launches too")
    p.add_argument("--set", nargs="*", default=[], metavar="NAME=VALUE",
                   help="constexprs to rewrite where a launch has them (integers), to "
                        "compare at the shapes of interest")
    p.add_argument("--jobs", type=int, default=os.cpu_count() or 1,
                   help="compiling processes (default: one a core)")
    p.add_argument("--dump", help=argparse.SUPPRESS)  # internal: compile in this tree
    args = p.parse_args(argv)
    log = os.path.abspath(args.log)
    if args.dump:
        sys.path.insert(0, os.getcwd())
        _dump(log, args.kernels, int_pairs(args.set), args.dump, args.jobs)
        return 0
    with tempfile.TemporaryDirectory() as tmp:
        int_pairs(args.set)  # checked here, before compiling
        base = _compiled(_base_tree(args.base, tmp), log, args.kernels, args.set,
                         os.path.join(tmp, "base.json"), args.jobs)
        new = _compiled(ROOT, log, args.kernels, args.set, os.path.join(tmp, "new.json"),
                        args.jobs)
    print("\n".join(report(base, new, args.all)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
