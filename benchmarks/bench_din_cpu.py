"""DIN attention on the CPU: the valid positions scored alone (packed) against every position.

Off CUDA, ``DINAttention`` runs its attention MLP on the valid positions of the behaviour
sequences only (``hashrec/modules/din.py``). This times one forward and backward of the
example config's attention (query and items 48 wide, ``attn_mlp`` 256 and 64, sequences
of 50) both ways on the same batches, whose lengths are those of generated Taobao-like
rows (``gen_taobao_data``, read in file order), and checks that the two give the same
output and gradients. Rounds alternate the two forms; the figures are medians.

    python benchmarks/bench_din_cpu.py --out benchmarks/results/din_cpu
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
from _timing import command_line, environment, write_results

from hashrec.modules import DINAttention, MLPOptions
from hashrec.tools.gen_taobao_data import generate

SEQUENCE = "click_50_seq__adgroup_id"


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--rows", type=int, default=20000, help="generated rows to take lengths from")
    p.add_argument("--batch", type=int, default=1024)
    p.add_argument("--length", type=int, default=50, help="sequence_length of the config")
    p.add_argument("--width", type=int, default=48, help="query and item width")
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--batches", type=int, default=4, help="batches a round")
    p.add_argument("--out", default=None, help="path prefix for .json and .md")
    return p.parse_args()


def _lengths(rows: int, cap: int) -> np.ndarray:
    """Per generated row, the behaviour sequence's length, cut at ``cap``."""
    with tempfile.TemporaryDirectory() as out:
        paths = generate(out, rows, seed=0, quiet=True)["data"]
        column = pq.read_table(paths[0], columns=[SEQUENCE])[SEQUENCE]
        tokens = pc.list_value_length(pc.split_pattern(pc.fill_null(column, ""), "|"))
        empty = pc.equal(pc.fill_null(column, ""), "").to_numpy(zero_copy_only=False)
    lengths = np.where(empty, 0, tokens.to_numpy(zero_copy_only=False))
    return np.minimum(lengths, cap).astype(np.int64)


def _step(att: DINAttention, query, seq, lengths) -> tuple[float, torch.Tensor, list]:
    start = time.perf_counter()
    out = att(query, seq, lengths)
    grads = torch.autograd.grad(out.square().sum(), [query, seq, *att.parameters()])
    return time.perf_counter() - start, out.detach(), grads


def main() -> None:
    args = _args()
    lengths = _lengths(args.rows, args.length)
    torch.manual_seed(0)
    att = DINAttention(args.width, args.width, MLPOptions(hidden_units=(256, 64)))
    batches = []
    for i in range(args.batches):
        part = lengths[i * args.batch:(i + 1) * args.batch]
        batches.append((torch.randn(args.batch, args.width, requires_grad=True),
                        torch.randn(args.batch, args.length, args.width, requires_grad=True),
                        torch.from_numpy(part)))
    times = {"packed": [], "padded": []}
    worst, scale = 0.0, 0.0
    for _ in range(1 + args.rounds):  # the first round warms up
        for form in ("padded", "packed"):
            att.packs = form == "packed"
            for query, seq, ls in batches:
                seconds, _, _ = _step(att, query, seq, ls)
                times[form].append(seconds)
    for query, seq, ls in batches:
        att.packs = True
        _, out_packed, grads_packed = _step(att, query, seq, ls)
        att.packs = False
        _, out_padded, grads_padded = _step(att, query, seq, ls)
        # Against the largest value of them all: a gradient that is zero in exact
        # arithmetic (the score's bias under softmax) differs by rounding noise alone.
        for a, b in zip([out_packed, *grads_packed], [out_padded, *grads_padded]):
            worst = max(worst, float((a - b).abs().max()))
            scale = max(scale, float(b.abs().max()))
    worst /= max(scale, 1e-30)
    warm = len(batches)
    ms = {form: 1000 * statistics.median(t[warm:]) for form, t in times.items()}
    taken = lengths[:args.batches * args.batch]
    results = {"command": command_line(), **environment(), "cpu_threads": torch.get_num_threads(),
               "cpu_count": os.cpu_count(), "batch": args.batch, "length": args.length,
               "width": args.width, "mean_length": float(taken.mean()),
               "share_of_positions_valid": float(taken.mean() / args.length),
               "padded_ms": ms["padded"], "packed_ms": ms["packed"],
               "speedup": ms["padded"] / ms["packed"], "largest_relative_difference": worst}
    lines = [f"Command: `{results['command']}`", "",
             f"Date {results['date']}, torch {results['torch']}, {results['cpu_threads']} "
             f"threads on {results['cpu_count']} cores. DIN attention forward + backward, batch "
             f"{args.batch}, sequences of {args.length} (mean length "
             f"{results['mean_length']:.2f}, from generated Taobao-like rows), width "
             f"{args.width}, attn_mlp 256, 64; medians of {args.rounds} rounds of "
             f"{args.batches} batches.", "",
             "| form | ms a batch | speedup |", "| --- | --- | --- |",
             f"| padded (every position) | {ms['padded']:.1f} | 1.00 |",
             f"| packed (valid positions) | {ms['packed']:.1f} | {results['speedup']:.2f} |", "",
             "Largest difference between the forms (output and every gradient), relative to "
             f"the largest value among them: {worst:.1e}."]
    print("\n".join(lines))
    if args.out:
        write_results(args.out, results, "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
