"""Registers a thread and spills of the HSTU attention kernels, compiled for sm_90.

No GPU needed: each kernel is compiled ahead of time for the H100/H200 with the
specializations its launch would get at the given shapes (the STU layer's q, k, v as
strided views of one projection, the mask padded to 16-byte rows), and ``ptxas -v``
reports what it allocates. Registers (and shared memory) bound how many programs an SM
holds at once, which is most of what these short programs' speed turns on; this is a
proxy, not a timing (``bench_hstu_attention.py --sweep`` times the settings on a GPU).

Usage::

    python benchmarks/hstu_kernel_registers.py --out benchmarks/results/hstu_kernel_registers
    python benchmarks/hstu_kernel_registers.py --settings 64/32/4,32/64/8
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, ROOT)
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import command_line, environment, write_results  # noqa: E402

from hashrec.modules.hstu_attention import triton as kernels  # noqa: E402
from hashrec.table.ops.launch import cdiv  # noqa: E402
from tests.compile_check import _source  # noqa: E402

MODULE = kernels.__name__
KERNELS = {"forward": "_forward_kernel", "keys_values": "_keys_values_kernel",
           "queries": "_queries_kernel"}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--length", type=int, default=78)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head_dim", type=int, default=32)
    p.add_argument("--dtype", default="bfloat16", choices=("bfloat16", "float16", "float32"))
    p.add_argument("--settings", default="",
                   help="query tile/key tile/warps, comma-separated (default: the library's "
                        "and every side of 16, 32, 64 with 4 and 8 warps)")
    p.add_argument("--out", default=None, help="path prefix for .json and .md")
    return p.parse_args(argv)


def _arguments(kernel: str, args) -> list:
    """The logged-launch form of one kernel's arguments at the benchmark's shapes."""
    length, heads, dim = args.length, args.heads, args.head_dim
    width = 4 * dim * heads  # u, v, q, k of the STU layer's projection
    padded = cdiv(length, 16) * 16
    tensor = ["tensor", args.dtype, True]
    views = [["value", length * width], ["value", width], ["value", dim]] * 3
    gradient = [["value", length * heads * dim], ["value", heads * dim], ["value", dim]]
    mask = [["value", length * padded], ["value", padded]]
    scalars = [["value", 0.17], ["value", 0.013]]
    head = [["value", length], ["value", heads]]
    if kernel == "forward":
        return [tensor] * 3 + [["tensor", "uint8", True], tensor] + head + views + mask \
            + gradient + scalars
    outputs = [tensor, tensor] if kernel == "keys_values" else [tensor]
    return [tensor] * 4 + [["tensor", "uint8", True]] + outputs + head + views + gradient \
        + mask + scalars


def registers(kernel: str, setting: tuple[int, int, int], args) -> dict:
    """{"registers", "spill_stores", "spill_loads", "shared_bytes", "resident_warps"} of
    one kernel at one setting."""
    import triton
    from triton.backends.compiler import GPUTarget
    block_n, block_m, warps = setting
    dim = triton.next_power_of_2(args.head_dim)
    kwargs = {"A": ["value", args.head_dim], "DV": ["value", args.head_dim],
              "BLOCK_A": ["value", dim], "BLOCK_DV": ["value", dim],
              "BLOCK_N": ["value", block_n], "BLOCK_M": ["value", block_m],
              "IEEE": ["value", args.dtype == "float32"], "num_warps": ["value", warps]}
    source, options = _source({"module": MODULE, "kernel": KERNELS[kernel],
                               "args": _arguments(kernel, args), "kwargs": kwargs})
    compiled = triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options)
    ptxas = os.path.join(os.path.dirname(triton.__file__), "backends", "nvidia", "bin",
                         "ptxas")
    with tempfile.TemporaryDirectory() as work:
        path = os.path.join(work, "kernel.ptx")
        with open(path, "w") as f:
            f.write(compiled.asm["ptx"])
        report = subprocess.run([ptxas, "--gpu-name", "sm_90a", "-v", path, "-o",
                                 os.path.join(work, "kernel.cubin")],
                                capture_output=True, text=True, check=True).stderr
    used = re.search(r"Used (\d+) registers", report)
    spills = re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", report)
    if used is None or spills is None:
        raise RuntimeError(f"unexpected ptxas report: {report}")
    shared = int(compiled.metadata.shared)
    return {"registers": int(used.group(1)), "spill_stores": int(spills.group(1)),
            "spill_loads": int(spills.group(2)), "shared_bytes": shared,
            "resident_warps": resident_warps(int(used.group(1)), shared, warps)}


def resident_warps(registers: int, shared: int, warps: int) -> int:
    """Warps an H100/H200 SM holds at once of programs of ``warps`` warps: 64K registers
    (allocated 8 a thread at a time), 228 KB of shared memory (1 KB reserved a program),
    at most 64 warps and 32 programs."""
    by_registers = 65536 // (-(-registers // 8) * 8 * 32 * warps)
    by_shared = 233472 // (shared + 1024)
    return min(by_registers, by_shared, 32, 64 // warps) * warps


def _settings(text: str) -> list[tuple[int, int, int]]:
    if text:
        return [tuple(int(part) for part in item.split("/")) for item in text.split(",")]
    library = list(dict.fromkeys(kernels.LAUNCH.values()))
    every = [(n, m, w) for n in (16, 32, 64) for m in (16, 32, 64) for w in (4, 8)]
    return library + [s for s in every if s not in library]


def markdown(r: dict) -> str:
    a = r["args"]
    lines = [f"# HSTU attention kernels: registers a thread on sm_90 ({a['dtype']}, "
             f"{a['length']} positions, {a['heads']} heads of {a['head_dim']})", "",
             f"Command: `{r['command']}`", "",
             f"Date {r['env']['date']}, torch {r['env']['torch']}, triton "
             f"{r['env']['triton']}; `ptxas -v` of each kernel compiled ahead of time (no "
             f"GPU). The library's settings: {r['launch']}.", "",
             "Each cell: registers a thread / warps an SM holds at once (of 64; by "
             "registers and shared memory), and spilled bytes where any.", "",
             "| query tile | key tile | warps | forward | keys_values | queries |",
             "| --- | --- | --- | --- | --- | --- |"]
    for row in r["rows"]:
        cells = [f"{row[k]['registers']} / {row[k]['resident_warps']}"
                 + (f" (spills {row[k]['spill_stores']} B)" if row[k]["spill_stores"] else "")
                 for k in KERNELS]
        lines.append(f"| {row['setting'][0]} | {row['setting'][1]} | {row['setting'][2]} | "
                     + " | ".join(cells) + " |")
    lines += ["", "Most warps an SM holds, then most positions a program, then fewest warps "
              "a program: " + ", ".join(f"{k} {tuple(v)}" for k, v in r["picks"].items())
              + "."]
    return "\n".join(lines) + "\n"


def picks(rows: list[dict]) -> dict:
    """Each kernel's setting of the most resident warps, then the most positions a
    program (query tile x key tile), then the fewest warps a program."""
    return {k: max(rows, key=lambda row: (row[k]["resident_warps"],
                                          row["setting"][0] * row["setting"][1],
                                          -row["setting"][2]))["setting"]
            for k in KERNELS}


def main(argv=None) -> dict:
    args = parse_args(argv)
    r = {"command": command_line(), "env": environment(), "args": vars(args),
         "launch": dict(kernels.LAUNCH), "rows": []}
    for setting in _settings(args.settings):
        row = {"setting": list(setting)}
        for kernel in KERNELS:
            row[kernel] = registers(kernel, setting, args)
        print(f"[hstu_kernel_registers] {setting}: " + ", ".join(
            f"{k} {row[k]['registers']}" for k in KERNELS), flush=True)
        r["rows"].append(row)
    r["picks"] = picks(r["rows"])
    text = markdown(r)
    print(text)
    if args.out:
        write_results(args.out, r, text)
    return r


if __name__ == "__main__":
    main()
