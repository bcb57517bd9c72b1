"""HSTU attention: the Triton kernels against the PyTorch reference, alone and in a layer.

At dlrm_hstu's training shapes (``bench_train``'s batch: 8,192 rows of 78 positions, 6
contextual tokens and 8 candidates a row, rows of 20 to 78 positions, 4 heads of 32,
BF16 autocast), times forward + backward of ``hashrec.modules.hstu_attention`` both ways
on the same inputs (the reference's (B, H, L, L) weights in memory against the kernels'
tiles in registers), and of one STU layer and one HSTU encoder block with either inside,
with each step's peak of allocated memory, and how far the kernels' outputs and
gradients lie from the reference's. On the CPU (``--smoke``) the kernels run in Triton's
interpreter: a check that the script runs, not a timing.

Usage::

    python benchmarks/bench_hstu_attention.py --out benchmarks/results/hstu_attention_gpu
    python benchmarks/bench_hstu_attention.py --smoke
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import command_line, environment, time_ms, write_results  # noqa: E402

from hashrec.modules import hstu as hstu_module  # noqa: E402
from hashrec.modules import stu as stu_module  # noqa: E402
from hashrec.modules.hstu import HSTUBlock  # noqa: E402
from hashrec.modules.hstu_attention import reference  # noqa: E402
from hashrec.modules.hstu_attention import triton as kernels  # noqa: E402
from hashrec.modules.stu import STULayer, stu_mask  # noqa: E402

WAYS = {"reference": reference.hstu_attention, "triton": kernels.hstu_attention}
# The training's BF16 autocast; float16 on the CPU, where Triton 3.6's interpreter
# multiplies bfloat16 tiles wrongly in tl.dot.
AUTOCAST = torch.bfloat16 if torch.cuda.is_available() else torch.float16


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--batch", type=int, default=8192)
    p.add_argument("--length", type=int, default=78)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--head_dim", type=int, default=32)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--sweep", action="store_true",
                   help="also time each kernel's other tile sides and warp counts")
    p.add_argument("--sweep_sides", default="16,32,64",
                   help="the tile sides (positions) the sweep tries, comma-separated")
    p.add_argument("--out", default=None, help="path prefix for .json and .md")
    p.add_argument("--smoke", action="store_true", help="tiny sizes on the CPU")
    args = p.parse_args(argv)
    if args.smoke:
        args.batch, args.length, args.reps = 4, 20, 1
    return args


def _step(fn, leaves, grad):
    """fn's forward under autocast (``AUTOCAST``) and its backward of ``grad`` into ``leaves``."""
    def run():
        for leaf in leaves:
            leaf.grad = None
        with torch.autocast(leaves[0].device.type, dtype=AUTOCAST):
            out = fn()
        out.float().backward(grad)
    return run


def _peak_mb(run, device) -> float:
    if device.type != "cuda":
        return 0.0
    run()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    run()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2 ** 20


def _mask(args, device) -> torch.Tensor:
    g = torch.Generator().manual_seed(0)
    lengths = torch.randint(20, args.length + 1, (args.batch,), generator=g)
    return stu_mask(lengths, args.length, 6, 0, torch.full((args.batch,), 8)).to(device)


def op(args, device, allowed) -> dict:
    """The attention alone, both ways on the same leaves: times, peaks and differences."""
    b, n, h, d = args.batch, args.length, args.heads, args.head_dim
    g = torch.Generator().manual_seed(1)
    projected = torch.randn(b, n, 3 * h * d, generator=g).to(device)
    leaves = [t.reshape(b, n, h, d).detach().clone().requires_grad_(True)
              for t in torch.split(projected, h * d, dim=-1)]
    grad = torch.randn(b, n, h, d, generator=g).to(device)
    result, outs = {}, {}
    for way, fn in WAYS.items():
        run = _step(lambda fn=fn: fn(*leaves, allowed, d ** -0.5, float(n)), leaves, grad)
        result[f"attention_{way}_ms"] = time_ms(run, args.reps)
        result[f"attention_{way}_peak_mb"] = _peak_mb(run, device)
        run()
        with torch.autocast(device.type, dtype=AUTOCAST):
            out = fn(*leaves, allowed, d ** -0.5, float(n)).float().detach()
        outs[way] = [out] + [leaf.grad.float().clone() for leaf in leaves]
    if args.sweep:
        sides = [int(side) for side in args.sweep_sides.split(",")]
        result.update(sweep(leaves, allowed, grad, d ** -0.5, float(n), args.reps, sides))
    for name, r, t in zip(("out", "dq", "dk", "dv"), outs["reference"], outs["triton"]):
        result[f"{name}_relative_difference"] = float((t - r).abs().max()
                                                      / r.abs().max().clamp(min=1e-30))
    return result


def sweep(leaves, allowed, grad, alpha, divisor, reps, sides) -> dict:
    """Each kernel's (query tile, key tile, warps) varied alone, the others at the
    library's, timed forward + backward; then all three at their fastest together."""
    library = dict(kernels.LAUNCH)
    timed, best = {}, {}

    def timing(launch):
        kernels.LAUNCH = launch
        run = _step(lambda: kernels.hstu_attention(*leaves, allowed, alpha, divisor),
                    leaves, grad)
        return time_ms(run, reps)
    try:
        mine = timing(library)
        for name in library:
            rows = []
            for side_n in sides:
                for side_m in sides:
                    for warps in (4, 8):
                        setting = (side_n, side_m, warps)
                        rows.append({"setting": list(setting),
                                     "ms": timing({**library, name: setting})})
            timed[name] = rows
            best[name] = min(rows, key=lambda row: row["ms"])["setting"]
        fastest = timing({name: tuple(setting) for name, setting in best.items()})
    finally:
        kernels.LAUNCH = library
    return {"sweep": timed, "sweep_library_ms": mine, "sweep_best": best,
            "sweep_best_ms": fastest}


def layers(args, device, allowed) -> dict:
    """One STU layer (dlrm_hstu's) and one HSTU encoder block with either way inside."""
    b, n = args.batch, args.length
    stu = STULayer(args.dim, args.heads, args.head_dim, args.head_dim, 0.1,
                   use_group_norm=True, scaling_seqlen=72).to(device)
    block = HSTUBlock(args.dim, args.head_dim, args.head_dim, args.heads).to(device)
    causal = torch.ones(n, n, dtype=torch.bool, device=device).tril()
    x = torch.randn(b, n, args.dim, device=device, requires_grad=True)
    grad = torch.randn(b, n, args.dim, device=device)
    result = {}
    for name, module, layer, call in (
            ("stu_layer", stu_module, stu, lambda: stu(x, allowed)),
            ("hstu_block", hstu_module, block, lambda: block(x, causal, float(n)))):
        dispatching = module.hstu_attention
        try:
            for way, fn in WAYS.items():
                module.hstu_attention = fn  # the layer's attention, this way
                run = _step(call, [x, *layer.parameters()], grad)
                result[f"{name}_{way}_ms"] = time_ms(run, args.reps)
                result[f"{name}_{way}_peak_mb"] = _peak_mb(run, device)
        finally:
            module.hstu_attention = dispatching
    return result


def markdown(r: dict) -> str:
    a = r["args"]
    lines = [f"# HSTU attention, forward + backward ({a['batch']} x {a['length']}, "
             f"{a['heads']} heads of {a['head_dim']}, {r['autocast']} autocast)", "",
             f"Command: `{r['command']}`", "",
             f"Date {r['env']['date']}, GPU {r['env']['gpu']}, torch {r['env']['torch']}, "
             f"triton {r['env']['triton']}. Medians of {a['reps']} steps; peak: the "
             f"step's most allocated memory above what it started with.", "",
             "| step | reference ms | triton ms | speedup | reference peak MB | "
             "triton peak MB |", "| --- | --- | --- | --- | --- | --- |"]
    for part in ("attention", "stu_layer", "hstu_block"):
        ref, tri = r[f"{part}_reference_ms"], r[f"{part}_triton_ms"]
        lines.append(f"| {part} | {ref:.3f} | {tri:.3f} | {ref / tri:.2f}x | "
                     f"{r[f'{part}_reference_peak_mb']:.0f} | "
                     f"{r[f'{part}_triton_peak_mb']:.0f} |")
    lines += ["", f"The kernels' results against the reference's, both under {r['autocast']} "
              "autocast "
              "(largest difference over the largest value): " + ", ".join(
                  f"{name} {r[f'{name}_relative_difference']:.1e}"
                  for name in ("out", "dq", "dk", "dv")) + "."]
    if "sweep" in r:
        lines += ["", "The kernels alone, forward + backward: the library's (query tile, key "
                  f"tile, warps) of each kernel ({r['launch']}) {r['sweep_library_ms']:.3f} ms; "
                  "each kernel's setting varied alone, the others at the library's:", "",
                  "| kernel | fastest setting | ms | slowest setting | ms |",
                  "| --- | --- | --- | --- | --- |"]
        for name, rows in r["sweep"].items():
            fast = min(rows, key=lambda row: row["ms"])
            slow = max(rows, key=lambda row: row["ms"])
            lines.append(f"| {name} | {tuple(fast['setting'])} | {fast['ms']:.3f} | "
                         f"{tuple(slow['setting'])} | {slow['ms']:.3f} |")
        lines += ["", f"All three at their fastest: {r['sweep_best_ms']:.3f} ms "
                  f"({r['sweep_best']}); every setting's time is in the JSON."]
    return "\n".join(lines) + "\n"


def main(argv=None) -> dict:
    args = parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() and not args.smoke else "cpu")
    r = {"command": command_line(), "env": environment(), "args": vars(args),
         "launch": dict(kernels.LAUNCH), "autocast": str(AUTOCAST).removeprefix("torch.")}
    allowed = _mask(args, device)
    r.update(op(args, device, allowed))
    r.update(layers(args, device, allowed))
    text = markdown(r)
    print(text)
    if args.out:
        write_results(args.out, r, text)
    return r


if __name__ == "__main__":
    main()
