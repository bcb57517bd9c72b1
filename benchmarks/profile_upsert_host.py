"""Where the host's issue time of the CUDA insert ops goes: a Python profile of the calls.

benchmark A's insert ops issue about ten kernels a call, and one call on its own (the
device idle until the host has issued it) is bound by the host where the device's work
is short. This times the host's issue of insert_or_assign, find_or_insert and find
(``time.perf_counter`` around each call, the device synchronized before it, medians of
``--reps``), then profiles ``--profile-calls`` calls of each insert op with cProfile
(which slows the host, so its times are shares, not the issue time) and writes the
functions with the most time of their own. Every insert call starts from the same
filled index (restored before it, untimed).

Usage::

    python benchmarks/profile_upsert_host.py --out OUT/upsert_host
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _table_fill import filled_index, restore, snapshot  # noqa: E402
from _timing import environment, write_results  # noqa: E402

from hashrec.table.ops.find.triton import find_values  # noqa: E402
from hashrec.table.ops.insert.upsert_rows import upsert_assign, upsert_embeddings  # noqa: E402
from hashrec.table.storage import TableStorage  # noqa: E402

I64 = torch.iinfo(torch.int64)


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--slots", type=int, default=1 << 24)
    p.add_argument("--batch", type=int, default=1 << 20)
    p.add_argument("--dim", type=int, default=8)
    p.add_argument("--reps", type=int, default=30)
    p.add_argument("--profile-calls", type=int, default=30)
    p.add_argument("--top", type=int, default=25, help="functions listed per op")
    p.add_argument("--out", default=None, help="path prefix for .json and .md")
    return p.parse_args()


def _keys(n: int, device: torch.device) -> torch.Tensor:
    return torch.randint(I64.min, I64.max, (n,), dtype=torch.int64, device=device)


def _issue_ms(fn, reps: int, reset=None) -> list[float]:
    out = []
    for i in range(reps + 2):
        if reset is not None:
            reset()
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if i >= 2:
            out.append((time.perf_counter() - t0) * 1e3)
    torch.cuda.synchronize()
    return out


def _profile(fn, calls: int, top: int, reset) -> tuple[str, list[dict]]:
    prof = cProfile.Profile()
    for _ in range(calls):
        reset()
        torch.cuda.synchronize()
        prof.enable()
        fn()
        prof.disable()
    torch.cuda.synchronize()
    text = io.StringIO()
    stats = pstats.Stats(prof, stream=text).sort_stats("tottime")
    stats.print_stats(top)
    rows = []
    for (file, line, name), (_, ncalls, tottime, cumtime, _) in sorted(
            stats.stats.items(), key=lambda kv: -kv[1][2])[:top]:
        rows.append({"function": f"{Path(file).name}:{line}({name})",
                     "calls_per_op": ncalls / calls, "own_us_per_op": tottime / calls * 1e6,
                     "inclusive_us_per_op": cumtime / calls * 1e6})
    return text.getvalue(), rows


def main() -> None:
    args = _args()
    if not torch.cuda.is_available():
        raise SystemExit("profile_upsert_host.py times the CUDA ops' host issue: no GPU here")
    device = torch.device("cuda")
    index, stored = filled_index(args.slots, 0.5, device)
    storage = TableStorage(index.num_buckets, index.bucket_capacity, index.keys, index.tags,
                           index.digests, index.scores,
                           torch.randn(index.capacity, args.dim, device=device))
    saved = snapshot(index)

    def reset() -> None:  # every insert call starts from the filled index
        restore(index, saved)

    n, hits = args.batch, int(0.6 * args.batch)
    ones = torch.ones(n, dtype=torch.int64, device=device)
    values = torch.randn(n, args.dim, device=device)

    def batch() -> torch.Tensor:
        pick = stored[torch.randint(0, stored.numel(), (hits,), device=device)]
        return torch.cat([pick, _keys(n - hits, device)])

    probe = batch()
    ops = {
        "insert_or_assign": lambda: upsert_assign(storage, batch(), None, ones, values, True),
        "find_or_insert": lambda: upsert_embeddings(storage, batch(), None, ones, True,
                                                    args.dim, 0.0, 0.01, seed=0),
        "find": lambda: find_values(storage, probe, None, args.dim),
    }
    # The batch is drawn inside each insert call (a few launches), as a caller's would
    # be; its own issue time is timed apart and reported.
    results = {"env": environment(), "command": " ".join(sys.argv), "slots": args.slots,
               "batch": n, "dim": args.dim, "reps": args.reps,
               "batch_draw_issue_ms": statistics.median(_issue_ms(batch, args.reps)),
               "ops": {}}
    for name, fn in ops.items():
        issue = _issue_ms(fn, args.reps, reset)
        entry = {"issue_ms": statistics.median(issue), "issue_min_ms": min(issue)}
        if name != "find":
            entry["profile_text"], entry["profile"] = _profile(fn, args.profile_calls,
                                                               args.top, reset)
        results["ops"][name] = entry
        print(name, json.dumps({k: v for k, v in entry.items() if k != "profile_text"}),
              flush=True)
    _write(args, results)


def _write(args: argparse.Namespace, results: dict) -> None:
    env = results["env"]
    lines = [f"# Host issue of the CUDA insert ops\n\nCommand: `{results['command']}`\n\n"
             f"Date {env['date']}, GPU {env['gpu']}, torch {env['torch']}, triton "
             f"{env['triton']}; {results['slots']} slots (bucket 128, load factor 0.5), {results['batch']} "
             f"keys a call (60% present), dim {results['dim']}. Issue: the host's clock "
             f"from the call to its return, the device idle before it (median of "
             f"{results['reps']}); the insert calls include drawing their batch "
             f"({results['batch_draw_issue_ms']:.3f} ms of it).\n",
             "| op | issue ms (median) | min |", "| --- | --- | --- |"]
    for name, e in results["ops"].items():
        lines.append(f"| {name} | {e['issue_ms']:.3f} | {e['issue_min_ms']:.3f} |")
    for name, e in results["ops"].items():
        if "profile" not in e:
            continue
        lines += ["", f"## {name}: the functions with the most own time (cProfile, us a "
                  "call; the profiler slows every Python call)", "",
                  "| function | calls | own us | inclusive us |", "| --- | --- | --- | --- |"]
        lines += [f"| `{r['function']}` | {r['calls_per_op']:.0f} | {r['own_us_per_op']:.1f} | "
                  f"{r['inclusive_us_per_op']:.1f} |" for r in e["profile"]]
    table = "\n".join(lines)
    print(table)
    if args.out:
        write_results(args.out, results, table + "\n")


if __name__ == "__main__":
    main()
