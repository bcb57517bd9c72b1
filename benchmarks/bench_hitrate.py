"""Speed of the hitrate tool's exact retrieval (``hashrec.tools.hitrate.top_k_items``).

Per block of ``--batch`` users of ``--interests`` interests, each user's ``--top_k`` best
of ``--items`` items of ``--dim`` floats, by inner product, timed three ways in one run:

- ``chunked``: the tool as it runs, ``--item_chunk_size`` items a matmul (its default);
- ``one_chunk``: the same over the whole index in one matmul (what chunking saves memory
  against: a (batch x interests x items) score block);
- ``masked_amax``: the chunked search as it ran before one interest skipped the interests'
  mask and max (two passes over each chunk's scores);
- ``matmul_only``: the scores' matmuls alone, no interest max and no top k: the floor
  of any exact search over this index, so the ratio to it is what the selection costs.

Usage::

    python benchmarks/bench_hitrate.py --items 1048576 --dim 64 --top_k 200 \\
        --out benchmarks/results/hitrate_gpu
    python benchmarks/bench_hitrate.py --smoke     # tiny sizes, any device
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

from _timing import command_line, environment, time_ms, write_results  # noqa: E402

from hashrec.tools.hitrate import top_k_items  # noqa: E402


def _matmuls(users: torch.Tensor, items: torch.Tensor, chunk: int) -> None:
    for start in range(0, items.shape[0], chunk):
        torch.matmul(users, items[start:start + chunk].T)


def _masked_amax(users: torch.Tensor, items: torch.Tensor, k: int, chunk: int) -> None:
    """The chunked search as the tool ran it for one interest too before: every chunk's
    scores masked and reduced over the interests before the top k."""
    absent = (users == 0).all(dim=-1, keepdim=True)
    best = users.new_full((users.shape[0], 0), float("-inf"))
    rows = torch.empty((users.shape[0], 0), dtype=torch.long, device=users.device)
    for start in range(0, items.shape[0], chunk):
        scores = torch.matmul(users, items[start:start + chunk].T).masked_fill(
            absent, float("-inf")).amax(dim=1)
        found = scores.topk(min(k, scores.shape[1]), dim=1)
        best = torch.cat([best, found.values], dim=1)
        rows = torch.cat([rows, found.indices + start], dim=1)
        if best.shape[1] > k:
            best, order = best.topk(k, dim=1)
            rows = rows.gather(1, order)


def measure(args: argparse.Namespace, device: torch.device) -> dict:
    """Median ms of each way (see the module docstring) and users per second."""
    generator = torch.Generator(device=device).manual_seed(0)
    items = torch.randn(args.items, args.dim, device=device, generator=generator)
    users = torch.randn(args.batch, args.interests, args.dim, device=device,
                        generator=generator)
    ways = {
        "chunked": lambda: top_k_items(users, items, args.top_k, args.item_chunk_size),
        "one_chunk": lambda: top_k_items(users, items, args.top_k, args.items),
        "masked_amax": lambda: _masked_amax(users, items, args.top_k, args.item_chunk_size),
        "matmul_only": lambda: _matmuls(users, items, args.item_chunk_size),
    }
    chunked, whole = ways["chunked"](), ways["one_chunk"]()
    if not torch.equal(chunked[0], whole[0]):
        raise SystemExit("chunked and one-chunk searches found different scores")
    times = {name: time_ms(fn, args.reps) for name, fn in ways.items()}
    return {name: {"ms": ms, "users_per_s": args.batch / ms * 1e3,
                   "x_matmul_only": ms / times["matmul_only"]}
            for name, ms in times.items()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--items", type=int, default=1 << 20)
    p.add_argument("--dim", type=int, default=64)
    p.add_argument("--batch", type=int, default=1024, help="users a block (--batch_size)")
    p.add_argument("--interests", type=int, default=1)
    p.add_argument("--top_k", type=int, default=200)
    p.add_argument("--item_chunk_size", type=int, default=65536)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--out", default=None, help="path prefix for .json and .md")
    p.add_argument("--smoke", action="store_true", help="tiny sizes (a check that it runs)")
    args = p.parse_args()
    if args.smoke:
        args.items, args.dim, args.batch, args.top_k = 3000, 8, 64, 20
        args.item_chunk_size, args.reps, args.interests = 1024, 2, 2
    device = torch.device(args.device)
    ways = measure(args, device)
    setup = {k: getattr(args, k) for k in ("items", "dim", "batch", "interests", "top_k",
                                            "item_chunk_size", "reps", "device")}
    results = {"command": command_line(), **environment(), "setup": setup, "ways": ways}
    lines = [f"# Hitrate retrieval: {args.batch} users x {args.interests} interests, top "
             f"{args.top_k} of {args.items} items of dim {args.dim}", "",
             f"Command: `{results['command']}`", "",
             f"Date {results['date']}, device {results['gpu'] if device.type == 'cuda' else 'cpu'}"
             f", torch {results['torch']}, triton {results['triton']}.", "",
             "| way | ms a block | users/s | x matmul only |", "| --- | --- | --- | --- |"]
    lines += [f"| {name} | {w['ms']:.3f} | {w['users_per_s']:,.0f} | {w['x_matmul_only']:.2f} |"
              for name, w in ways.items()]
    markdown = "\n".join(lines) + "\n"
    print(markdown)
    if args.out:
        write_results(args.out, results, markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
