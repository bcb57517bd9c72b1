"""Forward + backward of the HSTU layers' parts at dlrm_hstu's training shapes.

Times each way of computing an STU layer's per-head output norm and the positional
encoder's table reads, and the whole STU layer and positional encoder as
``hashrec.modules.stu`` builds them, under BF16 autocast (the benchmark's training
setting), then lists the CUDA kernels of one STU layer's step by self time. Shapes are
the dlrm_hstu example's at ``bench_train``'s batch: 8,192 rows of 78 positions (6
contextual tokens, 64 history, 8 candidates), width 128, 4 heads of 32.

Usage::

    python benchmarks/bench_stu_ops.py --out benchmarks/results/stu_ops_gpu
    python benchmarks/bench_stu_ops.py --smoke
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
from torch.nn import functional

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import command_line, environment, time_ms, write_results  # noqa: E402

from hashrec.modules.stu import PositionalEncoder, STULayer  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=8192)
    p.add_argument("--length", type=int, default=78)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--hidden", type=int, default=32)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--out", default=None, help="path prefix for .json and .md")
    p.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU")
    args = p.parse_args(argv)
    if args.smoke:
        args.batch, args.reps = 16, 2
    return args


def _step(fn, leaves):
    """fn's forward and a backward of its sum's gradient into ``leaves``."""
    def run():
        for leaf in leaves:
            leaf.grad = None
        with torch.autocast(leaves[0].device.type, dtype=torch.bfloat16):
            out = fn()
        out.float().sum().backward()
    return run


def norm_ways(args, device) -> dict:
    """The per-head norm of (B, L, H * D) values: group_norm against layer_norm of each
    head's D values followed by the per-head scale and shift."""
    b, n, h, d = args.batch, args.length, args.heads, args.hidden
    x = torch.randn(b, n, h * d, device=device, requires_grad=True)
    w = torch.randn(h, device=device, requires_grad=True)
    bias = torch.randn(h, device=device, requires_grad=True)

    def group():
        return functional.group_norm(x.reshape(b * n, h, d), h, w, bias, 1e-6).reshape(
            b, n, h * d)

    def layer():
        y = functional.layer_norm(x.reshape(b, n, h, d), [d], None, None, 1e-6)
        return (y * w.unsqueeze(-1) + bias.unsqueeze(-1)).reshape(b, n, h * d)

    with torch.no_grad():
        diff = (group() - layer()).abs().max().item()
    return {"group_norm_ms": time_ms(_step(group, [x, w, bias]), args.reps),
            "layer_norm_affine_ms": time_ms(_step(layer, [x, w, bias]), args.reps),
            "max_abs_difference": diff}


def read_ways(args, device) -> dict:
    """A (rows, D) table read at (B, L) indices: indexing against functional.embedding,
    with the indices spread over 128 rows (as positions are) and with every index on one
    row (time buckets: gaps past the last bucket all read it)."""
    b, n = args.batch, args.length
    table = torch.randn(2049, args.dim, device=device, requires_grad=True)
    out = {}
    for name, index in (("spread", torch.randint(0, 2049, (b, n), device=device) // 16),
                        ("one_row", torch.full((b, n), 2048, device=device))):
        out[f"index_{name}_ms"] = time_ms(
            _step(lambda index=index: table[index], [table]), args.reps)
        out[f"embedding_{name}_ms"] = time_ms(
            _step(lambda index=index: functional.embedding(index, table), [table]), args.reps)
    return out


def modules(args, device) -> dict:
    """One STU layer and the positional encoder as the model builds them."""
    b, n = args.batch, args.length
    layer = STULayer(args.dim, args.heads, args.hidden, args.hidden, 0.1,
                     use_group_norm=True, scaling_seqlen=72).to(device)
    x = torch.randn(b, n, args.dim, device=device, requires_grad=True)
    allowed = torch.ones(b, n, n, dtype=torch.bool, device=device).tril()
    encoder = PositionalEncoder(args.dim, 128, 2048, True, contextual_seq_len=6).to(device)
    lengths = torch.randint(10, n + 1, (b,), device=device)
    stamps = torch.sort(torch.randint(0, 10 ** 6, (b, n), device=device), dim=1).values
    targets = torch.full((b,), 8, device=device)
    out = {"stu_layer_ms": time_ms(_step(lambda: layer(x, allowed),
                                         [x, *layer.parameters()]), args.reps),
           "positional_encoder_ms": time_ms(
               _step(lambda: encoder(x, lengths, stamps.float(), targets),
                     [x, *encoder.parameters()]), args.reps)}
    if device.type == "cuda":
        step = _step(lambda: layer(x, allowed), [x, *layer.parameters()])
        step()
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            step()
            torch.cuda.synchronize()
        rows = sorted(prof.key_averages(), key=lambda e: -e.self_device_time_total)[:12]
        out["stu_layer_kernels"] = [{"name": e.key[:90], "ms": e.self_device_time_total / 1e3,
                                     "calls": e.count} for e in rows]
    return out


def markdown(r: dict) -> str:
    a = r["args"]
    lines = [f"# HSTU layer parts, forward + backward ({a['batch']} x {a['length']} x "
             f"{a['dim']}, {a['heads']} heads of {a['hidden']}, BF16 autocast)", "",
             f"Command: `{r['command']}`", "",
             f"Date {r['env']['date']}, GPU {r['env']['gpu']}, torch {r['env']['torch']}, "
             f"triton {r['env']['triton']}. Medians of {a['reps']} steps.", "",
             "| part | ms |", "| --- | --- |"]
    for key in ("group_norm_ms", "layer_norm_affine_ms", "index_spread_ms",
                "embedding_spread_ms", "index_one_row_ms", "embedding_one_row_ms",
                "stu_layer_ms", "positional_encoder_ms"):
        lines.append(f"| {key[:-3]} | {r[key]:.3f} |")
    lines.append("")
    lines.append(f"group_norm and layer_norm_affine differ by at most "
                 f"{r['max_abs_difference']:.2e}.")
    if "stu_layer_kernels" in r:
        lines += ["", "One STU layer's step, kernels by self time:", "",
                  "| kernel | ms | calls |", "| --- | --- | --- |"]
        lines += [f"| `{k['name']}` | {k['ms']:.3f} | {k['calls']} |"
                  for k in r["stu_layer_kernels"]]
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    args = parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    r = {"command": command_line(), "env": environment(), "args": vars(args)}
    r.update(norm_ways(args, device))
    r.update(read_ways(args, device))
    r.update(modules(args, device))
    text = markdown(r)
    print(text)
    if args.out:
        write_results(args.out, r, text)
    return r


if __name__ == "__main__":
    main()
