"""Host cost of one kernel launch: torch operators against Triton's launch paths.

A training step of small batches is host-bound when it launches hundreds of
kernels; this measures what each launch costs the host (the loop's wall time
over the launches, kernels too small to keep the device busy). Triton kernels
are launched three ways: ``kernel[grid](...)`` (argument binding, specialization
and cache lookup every call), the ``CompiledKernel`` that call returns
(``compiled[grid](...)``) and its launcher called directly with the stream
known (``compiled.run``), and through ``hashrec.table.ops.launch.fast_launch``
(HashRec's kernels: the launcher called directly after a specialization key built
on the host). Kernels with 4 and with 24 arguments.

Usage::

    python benchmarks/bench_launch.py --out benchmarks/results/launch_gpu
"""

from __future__ import annotations

import argparse
import os
import sys
import time

import torch
import triton
import triton.language as tl

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import write_results  # noqa: E402

from hashrec.table.ops.launch import FastKernel  # noqa: E402


@triton.jit
def _small(x_ptr, y_ptr, n, BLOCK: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    tl.store(y_ptr + i, tl.load(x_ptr + i, mask=i < n) + 1, mask=i < n)


@triton.jit
def _wide(a0, a1, a2, a3, a4, a5, a6, a7, a8, a9, a10, a11,
          n0, n1, n2, n3, n4, n5, n6, n7, n8, n9, BLOCK: tl.constexpr, FLAG: tl.constexpr):
    i = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    m = i < n0
    v = tl.load(a0 + i, mask=m) + n1 + n2 + n3 + n4 + n5 + n6 + n7 + n8 + n9
    if FLAG:
        v += tl.load(a1 + i, mask=m) + tl.load(a2 + i, mask=m) + tl.load(a3 + i, mask=m)
        v += tl.load(a4 + i, mask=m) + tl.load(a5 + i, mask=m) + tl.load(a6 + i, mask=m)
        v += tl.load(a7 + i, mask=m) + tl.load(a8 + i, mask=m) + tl.load(a9 + i, mask=m)
        v += tl.load(a10 + i, mask=m)
    tl.store(a11 + i, v, mask=m)


def _time(fn, launches: int, repeats: int) -> float:
    """Median host microseconds per launch of ``fn`` over ``repeats`` loops."""
    runs = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(launches):
            fn()
        runs.append((time.perf_counter() - start) / launches * 1e6)
        torch.cuda.synchronize()
    return sorted(runs)[len(runs) // 2]


def run(launches: int, repeats: int) -> dict:
    x = torch.zeros(1024, device="cuda", dtype=torch.float32)
    y = torch.empty_like(x)
    ptrs = [torch.zeros(1024, device="cuda", dtype=torch.float32) for _ in range(12)]
    ints = [1024] + [3] * 9
    grid = (1,)
    small = _small[grid](x, y, 1024, BLOCK=1024)
    wide_args = (*ptrs, *ints, 1024, True)
    wide = _wide[grid](*wide_args)
    stream = torch.cuda.current_stream().cuda_stream

    fast_small, fast_wide = FastKernel(_small), FastKernel(_wide)

    def direct(kernel, args):
        return lambda: kernel.run(1, 1, 1, stream, kernel.function, kernel.packed_metadata,
                                  None, None, None, *args)

    cases = {
        "torch x.add_(1)": lambda: x.add_(1),
        "torch torch.add(x, y, out=z)": lambda: torch.add(x, y, out=ptrs[0]),
        "triton 4 args kernel[grid]": lambda: _small[grid](x, y, 1024, BLOCK=1024),
        "triton 4 args compiled[grid]": lambda: small[(1, 1, 1)](x, y, 1024, 1024),
        "triton 4 args launcher": direct(small, (x, y, 1024, 1024)),
        "triton 4 args fast_launch": lambda: fast_small[grid](x, y, 1024, BLOCK=1024),
        "triton 24 args kernel[grid]": lambda: _wide[grid](*wide_args),
        "triton 24 args compiled[grid]": lambda: wide[(1, 1, 1)](*wide_args),
        "triton 24 args launcher": direct(wide, wide_args),
        "triton 24 args fast_launch": lambda: fast_wide[grid](*wide_args),
    }
    for fn in cases.values():  # warm every path
        fn()
    rows = [{"case": name, "host_us_per_launch": _time(fn, launches, repeats)}
            for name, fn in cases.items()]
    return {"rows": rows, "launches": launches, "repeats": repeats,
            "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "triton": triton.__version__, "python": sys.version.split()[0],
            "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "command": "python " + " ".join(sys.argv)}


def markdown(r: dict) -> str:
    lines = ["# Host cost of a kernel launch", "",
             f"{r['date']}, {r['device']}, torch {r['torch']}, triton {r['triton']}, "
             f"python {r['python']}.", "", f"Command: `{r['command']}`", "",
             f"Median over {r['repeats']} loops of {r['launches']} launches.", "",
             "| launch | host us per launch |", "|---|---:|"]
    lines += [f"| {row['case']} | {row['host_us_per_launch']:.2f} |" for row in r["rows"]]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--launches", type=int, default=2000)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--out", default=None, help="path prefix of the .json and .md results")
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("bench_launch needs a CUDA device", file=sys.stderr)
        return 2
    result = run(args.launches, args.repeats)
    text = markdown(result)
    print(text)
    if args.out:
        write_results(args.out, result, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
