"""Where the backward's gradient reduction spends its time, in the layer's setup.

10 tables, dim 128, 1,048,570 power-law ids a step (as ``bench_embedding_layer.py``):
the output gradients (one 512-byte row per id) are reduced per unique id. Timed
against ``reduce_rows`` (the library's reduction, at its tiles of the time), chunks of
CH sorted positions on W warps a program that:

* ``stream``: read their gradient rows in place (no gather) and sum them;
* ``gather``: read them through the dedup order (the reduction's random row gather);
* ``scan``: gather, run the segmented scan over the chunk and store each segment that
  ends in it (the reduction's stage 1 without the partials of crossing segments);
* ``dot``: gather, then sum each segment by a one-hot matrix product instead.

Device ms, median of 8. CUDA only.

    python benchmarks/probe_reduce_gpu.py --out benchmarks/results/probe_reduce_gpu
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from _timing import command_line, environment, time_device_ms  # noqa: E402

from hashrec.embedding.ops.fused import dedup  # noqa: E402
from hashrec.embedding.ops.fused import triton as fused_tt  # noqa: E402
from hashrec.table.ops.tiles import load_rows  # noqa: E402

TABLES, IDS, KEY_RANGE, DIM = 10, 1_048_570, 1_000_000, 128


@triton.jit
def _scan_add(a, a_s, b, b_s):
    return tl.where(b_s != 0, b, a + b), a_s | b_s


@triton.jit
def _probe_kernel(grad, order, seg, out, part, n, MODE: tl.constexpr, CH: tl.constexpr):
    c = tl.program_id(0).to(tl.int64)
    p = c * CH + tl.arange(0, CH)
    live = p < n
    col = tl.arange(0, 128)
    if MODE == 0:  # rows in place
        row = p
    else:
        row = tl.load(order + p, mask=live, other=0)
    g = load_rows(grad, row, 128, col, live, col[None, :] < 128, True)
    if MODE <= 1:
        tl.store(part + c * 128 + col, tl.sum(g, 0))
    else:
        r = tl.load(seg + p, mask=live, other=-1)
        prev = tl.load(seg + p - 1, mask=live & (p > c * CH), other=-2)
        nxt = tl.load(seg + p + 1, mask=(p + 1) < n, other=-3)
        opens = tl.broadcast_to((r != prev).to(tl.int32)[:, None], (CH, 128))
        if MODE == 2:
            acc, _ = tl.associative_scan((g, opens), 0, _scan_add)
        else:  # one-hot product: the segments that start in the chunk, by local index
            k = tl.cumsum((r != prev).to(tl.int32), 0) - 1
            sel = tl.arange(0, CH)[:, None] == k[None, :]
            sums = tl.dot(sel.to(tl.float32), g, input_precision="ieee")
            rseg = tl.max(tl.where(sel & live[None, :], r[None, :], -1), 1)
            tl.store(out + rseg[:, None] * 128 + col[None, :], sums, mask=(rseg >= 0)[:, None])
        if MODE == 2:
            ends = live & (r != nxt)
            tl.store(out + r[:, None] * 128 + col[None, :], acc, mask=ends[:, None])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", default=None, help="path prefix for .json and .md")
    args = p.parse_args()
    device = torch.device("cuda")
    ranks = torch.arange(1, KEY_RANGE + 1, device=device, dtype=torch.float64)
    probs = (ranks ** -1.05).float()
    per = IDS // TABLES
    perm = torch.randperm(KEY_RANGE, device=device)
    tags = torch.arange(TABLES, device=device)[:, None]
    pairs = ((tags << 40) | perm[torch.multinomial(probs, per * TABLES, replacement=True)]
             .view(TABLES, per)).flatten()
    d = dedup(pairs)
    n = pairs.numel()
    order, row_start = d.order, d.row_start
    seg = d.inverse[order]
    grad = torch.randn(n, DIM, device=device)
    positions = torch.arange(n, device=device)
    out = torch.empty(row_start.numel() - 1, DIM, device=device)
    ms = {}

    def timed(name, fn):
        ms[name] = time_device_ms(fn, 8)["device_ms"]
        print(f"{name:28s} {ms[name]:.4f}", flush=True)

    timed("reduce_rows", lambda: fused_tt.reduce_rows(grad, positions, order, row_start,
                                                      sorted_rows=seg))
    timed("reduce_rows_sorted", lambda: fused_tt.reduce_rows(
        grad, order, order, row_start, sorted_rows=seg, sorted_gidx=True))
    for ch in (16, 32, 64):
        part = torch.empty(triton.cdiv(n, ch), 128, device=device)
        for warps in (1, 2, 4, 8):
            for mode, name in ((0, "stream"), (1, "gather"), (2, "scan"), (3, "dot")):
                if mode == 3 and ch > 32:
                    continue
                launch = functools.partial(
                    _probe_kernel[(triton.cdiv(n, ch),)], grad, order, seg, out, part, n,
                    MODE=mode, CH=ch, num_warps=warps)
                timed(f"{name}_ch{ch}_w{warps}", launch)
    if args.out:
        env = environment()
        with open(f"{args.out}.json", "w") as f:
            json.dump({"env": env, "command": command_line(), "ms": ms}, f, indent=1)


if __name__ == "__main__":
    main()
