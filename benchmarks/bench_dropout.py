"""Dropout on the CPU: torch's against ``hashrec.modules.dropout``, alone and in an STU layer.

Times forward + backward of dropout at the STU layer's dropout shape (its [u, a v,
u * norm(a v)] of 3 x heads x hidden values a position) and of one whole STU layer, each
way in turn over interleaved rounds (a drift of the host hits both ways), at the
dlrm_hstu example's CPU setting: batch 256, 78 positions, width 128, 4 heads of 32,
float32, output dropout 0.1. The STU layer's torch way binds ``torch.nn.functional.dropout``
where the layer calls ``hashrec.modules.dropout.dropout``, for the timing only.

Usage::

    python benchmarks/bench_dropout.py --out benchmarks/results/dropout_cpu
    python benchmarks/bench_dropout.py --smoke
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
from unittest import mock

import torch
from torch.nn import functional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import command_line, environment, time_ms, write_results  # noqa: E402

from hashrec.modules import stu  # noqa: E402
from hashrec.modules.dropout import dropout  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--length", type=int, default=78)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--rate", type=float, default=0.1)
    p.add_argument("--reps", type=int, default=10, help="timed steps a round and way")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--out", default=None, help="path prefix for .json and .md")
    p.add_argument("--smoke", action="store_true", help="tiny sizes, one round")
    args = p.parse_args(argv)
    if args.smoke:
        args.batch, args.reps, args.rounds = 8, 2, 1
    return args


def _torch_dropout(x: torch.Tensor, p: float, training: bool) -> torch.Tensor:
    return functional.dropout(x, p, training)


def _step(fn, leaves):
    """fn's forward and a backward of its sum into ``leaves``."""
    def run():
        for leaf in leaves:
            leaf.grad = None
        fn().sum().backward()
    return run


def _rounds(args, ways: dict) -> dict:
    """{way: [median ms of each round]} of ``ways`` {name: (step, context)} in turn."""
    times = {name: [] for name in ways}
    for _ in range(args.rounds):
        for name, (step, context) in ways.items():
            with context():
                times[name].append(time_ms(step, args.reps))
    return times


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.manual_seed(0)
    b, n, width = args.batch, args.length, 3 * args.heads * args.hidden
    y = torch.randn(b, n, width, requires_grad=True)
    layer = stu.STULayer(args.dim, args.heads, args.hidden, args.hidden, args.rate,
                         use_group_norm=True, scaling_seqlen=72).train()
    x = torch.randn(b, n, args.dim, requires_grad=True)
    allowed = torch.ones(b, n, n, dtype=torch.bool).tril()
    rate = args.rate
    as_torch = lambda: mock.patch.object(stu, "dropout", _torch_dropout)  # noqa: E731
    ways = {
        "op_torch": (_step(lambda: functional.dropout(y, rate, True), [y]),
                     contextlib.nullcontext),
        "op_hashrec": (_step(lambda: dropout(y, rate, True), [y]), contextlib.nullcontext),
        "stu_layer_torch": (_step(lambda: layer(x, allowed), [x, *layer.parameters()]),
                            as_torch),
        "stu_layer_hashrec": (_step(lambda: layer(x, allowed), [x, *layer.parameters()]),
                              contextlib.nullcontext),
    }
    times = _rounds(args, ways)
    r = {"command": command_line(), "env": environment(), "args": vars(args),
         "threads": torch.get_num_threads(), "rounds_ms": times,
         "median_ms": {name: statistics.median(t) for name, t in times.items()}}
    m = r["median_ms"]
    r["op_speedup"] = m["op_torch"] / m["op_hashrec"]
    r["stu_layer_speedup"] = m["stu_layer_torch"] / m["stu_layer_hashrec"]
    text = markdown(r)
    print(text)
    if args.out:
        write_results(args.out, r, text)
    return r


def markdown(r: dict) -> str:
    a, m = r["args"], r["median_ms"]
    lines = [f"# Dropout on the CPU, forward + backward ({a['batch']} x {a['length']}, "
             f"rate {a['rate']}, float32, {r['threads']} threads)", "",
             f"Command: `{r['command']}`", "",
             f"Date {r['env']['date']}, torch {r['env']['torch']}. Medians over "
             f"{a['rounds']} interleaved rounds of {a['reps']}-step medians.", "",
             "| step | torch ms | hashrec ms | speedup |", "| --- | --- | --- | --- |",
             f"| dropout of (B, L, {3 * a['heads'] * a['hidden']}) | {m['op_torch']:.2f} | "
             f"{m['op_hashrec']:.2f} | {r['op_speedup']:.2f}x |",
             f"| STU layer (width {a['dim']}, {a['heads']} heads of {a['hidden']}) | "
             f"{m['stu_layer_torch']:.2f} | {m['stu_layer_hashrec']:.2f} | "
             f"{r['stu_layer_speedup']:.2f}x |", ""]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
