"""Registers, spills and resident programs of project kernels on sm_90, without a GPU.

Takes launches from the log that ``make test`` writes (``build/launches.jsonl``: every
interpreted kernel launch of the tests), rewrites their constexprs and launch options
to the shapes of interest (``--set CAP=128 B=32 ...``, ``--warps``, ``--maxnreg``),
compiles each to PTX with Triton and runs Triton's bundled ``ptxas -v`` on it. Prints,
per kernel, warp count and register cap: registers a thread, spill bytes, and how many
programs fit on one
multiprocessor of an H100/H200 by registers (65,536 a multiprocessor), warps (64) and
programs (32).

Example (the upsert's insert kernels at benchmark A's shape):

    python benchmarks/kernel_registers.py build/launches.jsonl \\
        --kernels upsert_lanes_kernel upsert_block_kernel \\
        --set CAP=128 CAP_P2=128 LINE=32 B=32 BLOCK=32 W=4 WIN=16 BI=16 ALLOW_EVICT=1 \\
        --require MASKS=1 LANES=1 --warps 2 4
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _cli import int_pairs  # noqa: E402

_REGS_PER_SM, _WARPS_PER_SM, _PROGRAMS_PER_SM = 65536, 64, 32


def _ptxas_info(ptx: str, maxnreg: int | None) -> tuple[int, int]:
    """(registers a thread, spill store + load bytes) from ``ptxas -v`` for sm_90a."""
    import triton
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin", "ptxas")
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "kernel.ptx")
        with open(path, "w") as f:
            f.write(ptx)
        cmd = [ptxas, "-v", "--gpu-name", "sm_90a", path, "-o", os.devnull]
        if maxnreg:
            cmd += ["-maxrregcount", str(maxnreg)]
        err = subprocess.run(cmd, capture_output=True, text=True, check=True).stderr
    regs = int(re.findall(r"Used (\d+) registers", err)[-1])
    spills = sum(int(x) for x in re.findall(r"(\d+) bytes spill (?:stores|loads)", err))
    return regs, spills


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("log", help="launch log of the interpreted tests (build/launches.jsonl)")
    p.add_argument("--kernels", nargs="+", required=True, help="kernel names to report")
    p.add_argument("--set", nargs="*", default=[], metavar="NAME=VALUE",
                   help="constexprs to rewrite where a launch has them")
    p.add_argument("--require", nargs="*", default=[], metavar="NAME=VALUE",
                   help="take only launches whose constexpr NAME (if it has one) is VALUE")
    p.add_argument("--maxnreg", nargs="*", type=int, default=[],
                   help="register caps a thread to compile with (0: none; default: the "
                        "logged launch's)")
    p.add_argument("--warps", nargs="*", type=int, default=[],
                   help="warp counts to compile each kernel at (default: the launch's)")
    args = p.parse_args(argv)

    import triton
    from triton.backends.compiler import GPUTarget

    from tests.compile_check import _normalized, _source

    rewrite, require = int_pairs(args.set), int_pairs(args.require)
    picked: dict[str, dict] = {}
    with open(args.log) as f:
        for line in f:
            entry = json.loads(line)
            name, kwargs = entry.get("kernel"), entry.get("kwargs", {})
            if name not in args.kernels or name in picked:
                continue
            if any(k in kwargs and int(kwargs[k][1] or 0) != v for k, v in require.items()):
                continue
            for k, v in rewrite.items():
                if k in kwargs:
                    kwargs[k] = ["value", v]
            picked[name] = entry
    print("| kernel | warps | register cap | registers a thread | spill bytes | "
          "programs a multiprocessor | warps a multiprocessor |")
    print("| --- | --- | --- | --- | --- | --- | --- |")
    for name in args.kernels:
        if name not in picked:
            print(f"| {name} | - | - | not launched by the tests with {require} | | | |")
            continue
        entry = picked[name]
        for warps in args.warps or [entry["kwargs"].get("num_warps", ["value", 4])[1]]:  # Triton's default 4
            entry["kwargs"]["num_warps"] = ["value", warps]
            source, options = _source(_normalized(entry))
            for cap in args.maxnreg or [options.get("maxnreg")]:
                options = {**options, "maxnreg": cap or None}
                compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32),
                                          options=options)
                regs, spills = _ptxas_info(compiled.asm["ptx"], cap)
                held = -(-regs // 8) * 8  # registers are held in steps of 8 a thread
                programs = min(_REGS_PER_SM // (held * 32 * warps), _WARPS_PER_SM // warps,
                               _PROGRAMS_PER_SM)
                print(f"| {name} | {warps} | {cap or '-'} | {regs} | {spills} | {programs} "
                      f"| {programs * warps} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
