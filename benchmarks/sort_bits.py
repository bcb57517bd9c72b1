"""How torch.sort's time on CUDA depends on the bits its keys span.

The upsert sorts one key per batch entry (``upsert.py``: bucket bits, then hash bits).
This times a stable ``torch.sort`` of n int32 keys drawn uniformly from [0, 2**bits),
and of int16 / int64 keys, to see whether keys spanning fewer bits sort faster.

    python benchmarks/sort_bits.py --out benchmarks/results/sort_bits_gpu
"""

from __future__ import annotations

import argparse
import os
import sys

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import command_line, environment, time_device_ms, write_results  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--n", type=int, default=1 << 20)
    p.add_argument("--reps", type=int, default=20)
    p.add_argument("--out", default=None)
    args = p.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("sort_bits.py times CUDA sorts; no CUDA device here")
    rows = []
    cases = [("int32", b) for b in (8, 16, 19, 24, 31)] + [("int16", 15), ("int64", 62)]
    for dtype, bits in cases:
        dt = getattr(torch, dtype)
        keys = [torch.randint(0, 1 << bits, (args.n,), dtype=dt, device="cuda")
                for _ in range(4)]
        t = time_device_ms(lambda k: torch.sort(k, stable=True), args.reps,
                           setup=lambda i, keys=keys: keys[i % 4])
        rows.append({"dtype": dtype, "bits": bits, "ms": t["device_ms"]})
        print(rows[-1], flush=True)
    lines = ["| keys | bits | ms |", "| --- | --- | --- |"]
    lines += [f"| {r['dtype']} | {r['bits']} | {r['ms']:.4f} |" for r in rows]
    table = "\n".join(lines)
    print(table)
    if args.out:
        env = environment()
        write_results(args.out, {"command": command_line(), "env": env, "n": args.n,
                                 "rows": rows},
                      f"# Stable torch.sort of {args.n} keys by the bits they span\n\n"
                      f"Command: `{command_line()}`\n\nDate {env['date']}, GPU "
                      f"{env['gpu']}, torch {env['torch']}, triton {env['triton']}. Keys "
                      f"uniform in [0, 2**bits); device time per sort (values: the int64 "
                      f"indices torch.sort returns).\n\n{table}\n")


if __name__ == "__main__":
    main()
