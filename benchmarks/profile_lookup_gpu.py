"""Device time of a dynamic table's training lookup at max_capacity, kernel by kernel.

A table like the example dynamicemb config's storage (dim 16, LFU scores, NORMAL
initializer, Adam state, frequency admission at 3) is fed power-law batches of
unique keys until it is at max_capacity; then ``--reps`` training lookups of
fresh batches run eagerly (``HASHREC_LOOKUP_GRAPHS=0``: every kernel on its own)
under torch.profiler. Reported per lookup: device time per kernel, the total, the
batch's unique keys and how many of them missed the table (what the admission
counter probes). ``--counter_buckets`` compares widths of the counter's buckets
(1,024 slots is the default) in one run.

    python benchmarks/profile_lookup_gpu.py --out benchmarks/results/lookup_kernels_gpu
    python benchmarks/profile_lookup_gpu.py --smoke   # tiny, CPU, TRITON_INTERPRET
"""

from __future__ import annotations

import argparse
import collections
import os
import sys

from _cli import add_out_and_smoke, parse_with_smoke


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--capacity", type=int, default=955_000, help="max_capacity (rows)")
    p.add_argument("--unique", type=int, default=300_000, help="unique keys per lookup")
    p.add_argument("--key_range", type=int, default=20_000_000)
    p.add_argument("--alpha", type=float, default=1.05)
    p.add_argument("--counter_buckets", type=int, nargs="+", default=[1024, 128])
    p.add_argument("--fill", type=int, default=40, help="lookups before the timed ones")
    p.add_argument("--reps", type=int, default=10)
    add_out_and_smoke(p)
    args = parse_with_smoke(p)
    if args.smoke:
        os.environ.setdefault("HASHREC_FORCE_TRITON", "1")
        args.capacity, args.unique, args.key_range = 2048, 300, 5000
        args.counter_buckets, args.fill, args.reps = [64, 16], 4, 2
    return args


ARGS = _args()
os.environ["HASHREC_LOOKUP_GRAPHS"] = "0"
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from _timing import environment, write_results  # noqa: E402

from hashrec.table import HashTable, TableOptions  # noqa: E402
from hashrec.table.optim import SparseAdam  # noqa: E402
from hashrec.table.options import AdmissionOptions, InitializerArgs  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
CUDA = DEVICE.type == "cuda"


def _batches(count: int, seed: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(unique keys, their counts) per lookup: power-law draws, at most ``--unique``."""
    gen = torch.Generator(device=DEVICE).manual_seed(seed)
    ranks = torch.arange(1, ARGS.key_range + 1, device=DEVICE, dtype=torch.float64)
    probs = (ranks ** -ARGS.alpha).float()
    perm = torch.randperm(ARGS.key_range, device=DEVICE, generator=gen)
    out = []
    for _ in range(count):
        drawn = perm[torch.multinomial(probs, 2 * ARGS.unique, replacement=True, generator=gen)]
        keys, counts = torch.unique(drawn, return_counts=True)
        if keys.numel() > ARGS.unique:
            pick = torch.randperm(keys.numel(), device=DEVICE, generator=gen)[:ARGS.unique]
            keys, counts = keys[pick], counts[pick]
        out.append((keys, counts))
    return out


def _table(counter_bucket: int) -> HashTable:
    return HashTable(TableOptions(
        dim=16, max_capacity=ARGS.capacity, bucket_capacity=128, score_strategy="LFU",
        initializer=InitializerArgs(mode="NORMAL", std_dev=0.05), optimizer=SparseAdam(lr=1e-3),
        admission=AdmissionOptions(threshold=3, counter_bucket_capacity=counter_bucket),
        device=DEVICE, seed=0))


def _profile(counter_bucket: int, fill: list, timed: list) -> dict:
    table = _table(counter_bucket)
    for keys, counts in fill:
        table.advance_step()
        table.lookup(keys, train=True, counts=counts)
    before = table.stats()
    activities = [torch.profiler.ProfilerActivity.CPU]
    if CUDA:
        activities.append(torch.profiler.ProfilerActivity.CUDA)
        torch.cuda.synchronize()
    with torch.profiler.profile(activities=activities) as prof:
        for keys, counts in timed:
            table.advance_step()
            table.lookup(keys, train=True, counts=counts)
        if CUDA:
            torch.cuda.synchronize()
    after = table.stats()
    kernels: dict[str, float] = collections.Counter()
    for event in prof.key_averages():
        device_us = getattr(event, "self_device_time_total", 0) or 0
        if device_us > 0:
            kernels[event.key[:80]] += device_us / 1e3 / len(timed)
    lookups = after["lookups"] - before["lookups"]
    return {"counter_bucket_capacity": counter_bucket, "size": table.size(),
            "capacity": table.capacity(), "unique_per_lookup": lookups / len(timed),
            "misses_per_lookup": (lookups - (after["hits"] - before["hits"])) / len(timed),
            "device_ms_per_lookup": sum(kernels.values()),
            "kernels_ms_per_lookup": dict(sorted(kernels.items(), key=lambda kv: -kv[1]))}


def _markdown(results: dict) -> str:
    env = results["environment"]
    lines = ["# A dynamic table's training lookup at max_capacity, kernel by kernel", "",
             f"{env['date']}, GPU {env['gpu']}, torch {env['torch']}, triton {env['triton']}.",
             "", f"Command: `{results['command']}`", ""]
    for run in results["runs"]:
        lines += [f"## Counter buckets of {run['counter_bucket_capacity']} slots", "",
                  f"Table {run['size']:,} of {run['capacity']:,} rows; per lookup "
                  f"{run['unique_per_lookup']:,.0f} unique keys, "
                  f"{run['misses_per_lookup']:,.0f} of them missing; device "
                  f"{run['device_ms_per_lookup']:.3f} ms.", "",
                  "| kernel | ms per lookup |", "|---|---:|"]
        lines += [f"| `{name}` | {ms:.4f} |" for name, ms in
                  list(run["kernels_ms_per_lookup"].items())[:15]]
        lines.append("")
    return "\n".join(lines)


def main() -> None:
    fill, timed = _batches(ARGS.fill, 1), _batches(ARGS.reps, 2)
    runs = [_profile(width, fill, timed) for width in ARGS.counter_buckets]
    results = {"environment": environment(), "runs": runs,
               "command": "python benchmarks/profile_lookup_gpu.py " + " ".join(sys.argv[1:])}
    text = _markdown(results)
    print(text)
    if ARGS.out:
        write_results(ARGS.out, results, text)


if __name__ == "__main__":
    main()
