"""Where the time of a CUDA upsert goes: host issue time, GPU time per kernel, warps.

For each load factor (index filled directly, dim 128 value rows) and each write op
of bench_table_gpu.py (insert_or_assign, find_or_insert) on fresh 1M-key batches
(60% present):

* ``elapsed_ms``: median device time of one call between syncs (what the
  benchmark reports), ``issue_ms``: median host time to issue the call (no sync);
* ``warps``: elapsed_ms of insert_or_assign per ``UPSERT_WARPS`` value;
* a kernel table (torch.profiler) and a Python profile (cProfile, top functions
  by own time) of a few calls, printed.

    python benchmarks/profile_upsert_gpu.py --out benchmarks/results/upsert_profile_gpu
    python benchmarks/profile_upsert_gpu.py --smoke   # tiny, CPU, TRITON_INTERPRET
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import statistics
import sys
import time

from _cli import add_out_and_smoke, parse_with_smoke


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--slots", type=int, default=64 * 2 ** 20)
    p.add_argument("--batch", type=int, default=1_048_576)
    p.add_argument("--load-factors", type=float, nargs="+", default=[0.5, 1.0])
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--warps", type=int, nargs="+", default=[1, 2, 4])
    add_out_and_smoke(p)
    args = parse_with_smoke(p)
    if args.smoke:
        args.slots, args.batch, args.dim, args.reps, args.warps = 4096, 300, 8, 1, [1]
    return args


ARGS = _args()
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from _table_fill import filled_index, random_keys  # noqa: E402
from _timing import environment, write_results  # noqa: E402

from hashrec.table.ops.insert import upsert as upsert_tt  # noqa: E402
from hashrec.table.ops.insert.rows import read_or_init_rows, write_rows  # noqa: E402
from hashrec.table.storage import TableStorage  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
CUDA = DEVICE.type == "cuda"


def _sync() -> None:
    if CUDA:
        torch.cuda.synchronize()


def insert_or_assign(storage: TableStorage, keys: torch.Tensor, values: torch.Tensor) -> None:
    res = upsert_tt.upsert_slots(storage, keys, None, torch.ones_like(keys), allow_evict=True)
    write_rows(storage.values, res.slots, None, values)


def find_or_insert(storage: TableStorage, keys: torch.Tensor) -> torch.Tensor:
    res = upsert_tt.upsert_slots(storage, keys, None, torch.ones_like(keys), allow_evict=True)
    return read_or_init_rows(storage.values, keys, None, res.slots, res.created, res.inserted,
                             storage.row_dim, 0.0, 0.01, seed=0)


def _timed(fn, batches) -> tuple[float, float]:
    """(median elapsed ms, median issue ms) of fn(batch) over the batches after 2 warm-ups."""
    elapsed, issue = [], []
    for i, keys in enumerate(batches):
        _sync()
        if CUDA:
            start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
            start.record()
        t0 = time.perf_counter()
        fn(keys)
        t1 = time.perf_counter()
        if CUDA:
            end.record()
        _sync()
        if i >= 2:
            issue.append((t1 - t0) * 1e3)
            elapsed.append(start.elapsed_time(end) if CUDA else issue[-1])
    return statistics.median(elapsed), statistics.median(issue)


def _profiles(ops: dict, batches) -> None:
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if CUDA else [])
    with profile(activities=activities) as prof:
        for fn in ops.values():
            fn(batches[0])
        _sync()
    print(prof.key_averages().table(sort_by="self_cuda_time_total" if CUDA else
                                    "self_cpu_time_total", row_limit=16), flush=True)
    pr = cProfile.Profile()
    pr.enable()
    for keys in batches[1:4]:
        ops["insert_or_assign"](keys)
    _sync()
    pr.disable()
    text = io.StringIO()
    pstats.Stats(pr, stream=text).sort_stats("tottime").print_stats(22)
    print(text.getvalue(), flush=True)


def run_load_factor(lf: float) -> dict:
    index, stored = filled_index(ARGS.slots, lf, DEVICE)
    storage = TableStorage(index.num_buckets, index.bucket_capacity, index.keys, index.tags,
                           index.digests, index.scores,
                           torch.randn(index.capacity, ARGS.dim, device=DEVICE))
    n = ARGS.batch

    def batches():
        hits = int(0.6 * n)
        return [torch.cat([stored[torch.randint(0, stored.numel(), (hits,), device=DEVICE)],
                           random_keys(n - hits, DEVICE)]) for _ in range(ARGS.reps + 2)]

    vals = torch.randn(n, ARGS.dim, device=DEVICE)
    ops = {"insert_or_assign": lambda k: insert_or_assign(storage, k, vals),
           "find_or_insert": lambda k: find_or_insert(storage, k)}
    row = {"load_factor": lf, "measured_load_factor": storage.size() / storage.capacity}
    for name, fn in ops.items():
        row[name] = dict(zip(("elapsed_ms", "issue_ms"), _timed(fn, batches())))
    default = upsert_tt.UPSERT_WARPS
    row["warps"] = {}
    for warps in ARGS.warps:
        upsert_tt.UPSERT_WARPS = warps
        row["warps"][warps] = _timed(ops["insert_or_assign"], batches())[0]
    upsert_tt.UPSERT_WARPS = default
    _profiles(ops, batches())
    return row


def main() -> None:
    results = {"env": environment(), "slots": ARGS.slots, "batch": ARGS.batch, "dim": ARGS.dim,
               "rows": []}
    for lf in ARGS.load_factors:
        row = run_load_factor(lf)
        results["rows"].append(row)
        print(json.dumps(row), flush=True)
    if ARGS.out:
        lines = ["| load factor | op | elapsed ms | host issue ms |", "| --- | --- | --- | --- |"]
        for r in results["rows"]:
            for op in ("insert_or_assign", "find_or_insert"):
                lines.append(f"| {r['measured_load_factor']:.3f} | {op} | "
                             f"{r[op]['elapsed_ms']:.3f} | {r[op]['issue_ms']:.3f} |")
        env = results["env"]
        write_results(ARGS.out, results,
                      f"# Upsert time split on GPU\n\nDate {env['date']}, GPU {env['gpu']}, "
                      f"torch {env['torch']}, triton {env['triton']}; {results['slots']} "
                      f"slots, {results['batch']} keys per call, dim {results['dim']}.\n\n"
                      + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
