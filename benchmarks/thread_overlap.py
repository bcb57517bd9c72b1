"""Whether a second Python thread adds kernel-launch throughput on a GPU host.

A training step on one GPU is bound by the host thread that issues its kernels.
PyTorch releases the GIL inside every operator, so a second thread issuing other
work (say, the next batch's deduplication) could run in those gaps, or could
slow both threads down by fighting over the GIL. This times the same operator
loop issued by one thread, then the loop twice over by two threads at once, each
thread on its own CUDA stream, and reports the launches per second of each and
their ratio (2.0: the second thread came for free; 1.0: no gain; below 1: worse).

Usage::

    python benchmarks/thread_overlap.py --out benchmarks/results/thread_overlap_gpu
"""

from __future__ import annotations

import argparse
import sys
import threading
import time

import torch
from _timing import environment, write_results  # noqa: E402


def _loops(device: torch.device) -> dict:
    """Operator loops of a few launches each, on inputs made once."""
    small = torch.zeros(4096, device=device)
    keys = torch.randint(0, 1 << 40, (1 << 16,), device=device)
    index = torch.randint(0, 4096, (1 << 14,), device=device)

    def inplace():
        small.add_(1.0)

    def allocating():
        small * 2.0 + 1.0

    def sort_and_gather():
        values, order = torch.sort(keys)
        small.index_select(0, index)
        torch.ne(values[1:], values[:-1]).cumsum(0)

    return {"inplace_add": (inplace, 1), "allocating_mul_add": (allocating, 2),
            "sort_gather_cumsum": (sort_and_gather, 6)}


def _issue(fn, calls: int, stream: torch.cuda.Stream) -> None:
    with torch.cuda.stream(stream):
        for _ in range(calls):
            fn()


def _time(fn, calls: int, threads: int, device: torch.device) -> float:
    """Seconds for ``threads`` threads to issue ``calls`` calls each (and the device to
    finish them)."""
    streams = [torch.cuda.Stream(device) for _ in range(threads)]
    workers = [threading.Thread(target=_issue, args=(fn, calls, s)) for s in streams]
    torch.cuda.synchronize(device)
    start = time.perf_counter()
    for w in workers:
        w.start()
    for w in workers:
        w.join()
    torch.cuda.synchronize(device)
    return time.perf_counter() - start


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--calls", type=int, default=20000)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--switch_interval_ms", type=float, default=0.5,
                   help="sys.setswitchinterval while timing (the trainer's on a GPU)")
    p.add_argument("--out", default=None)
    args = p.parse_args(argv)
    if not torch.cuda.is_available():
        print("thread_overlap.py needs a GPU", file=sys.stderr)
        return 1
    device = torch.device("cuda", 0)
    sys.setswitchinterval(args.switch_interval_ms / 1000)
    rows = []
    for name, (fn, launches) in _loops(device).items():
        _time(fn, 200, 2, device)  # warm-up: kernels, allocator, streams
        one = min(_time(fn, args.calls, 1, device) for _ in range(args.reps))
        two = min(_time(fn, args.calls, 2, device) for _ in range(args.reps))
        rows.append({"loop": name, "launches_per_call": launches, "calls": args.calls,
                     "one_thread_s": one, "two_threads_s": two,
                     "one_thread_us_per_call": one / args.calls * 1e6,
                     "throughput_ratio": 2 * one / two})
        print(f"{name}: one thread {one / args.calls * 1e6:.2f} us/call, two threads "
              f"{two / (2 * args.calls) * 1e6:.2f} us/call each, ratio {2 * one / two:.2f}",
              flush=True)
    if args.out:
        lines = ["# Launch throughput of one host thread against two",
                 "", f"{environment_line()}", "",
                 f"Command: `python benchmarks/thread_overlap.py {' '.join(argv or sys.argv[1:])}`",
                 "", f"Switch interval {args.switch_interval_ms} ms; best of {args.reps}; "
                 "ratio = two threads' calls per second / one thread's (2.0: the second "
                 "thread is free).", "",
                 "| loop | launches/call | one thread us/call | two threads us/call (calls of both) | ratio |",
                 "|---|---:|---:|---:|---:|"]
        for r in rows:
            lines.append(f"| {r['loop']} | {r['launches_per_call']} | "
                         f"{r['one_thread_us_per_call']:.2f} | "
                         f"{r['two_threads_s'] / (2 * r['calls']) * 1e6:.2f} | "
                         f"{r['throughput_ratio']:.2f} |")
        write_results(args.out, {"environment": environment(), "rows": rows,
                                 "switch_interval_ms": args.switch_interval_ms},
                      "\n".join(lines) + "\n")
    return 0


def environment_line() -> str:
    env = environment()
    return ", ".join(f"{k} {v}" for k, v in sorted(env.items()))


if __name__ == "__main__":
    sys.exit(main())
