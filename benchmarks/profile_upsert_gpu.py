"""Where the time of a CUDA upsert goes: host issue time, GPU time per kernel, warps.

For each load factor (index filled directly, dim 128 value rows) and each write op
of bench_table_gpu.py (insert_or_assign, find_or_insert) on fresh 1M-key batches
(60% present):

* ``elapsed_ms``: median device time of one call between syncs (what the
  benchmark reports), ``issue_ms``: median host time to issue the call (no sync);
* ``configs``: elapsed_ms of insert_or_assign per insert-program launch: the
  per-position form (``UPSERT_CONFIG``: sorted positions per program, warps, keys in
  registers) for every combination of ``--runs``, ``--warps`` and ``--bi`` when
  ``--block`` holds 0, and the block form (``UPSERT_BLOCK``: positions per program,
  longest run in tiles, warps) for every other ``--block`` with ``--width``,
  ``--warps`` and ``--bi``;
* ``allocator``: the CUDA caching allocator's counters over the timed calls
  (device mallocs and frees, retries after a failed malloc, syncs of all streams):
  anything but zeros means calls wait on the allocator;
* a kernel table (torch.profiler) and a Python profile (cProfile, top functions
  by own time) of a few calls, printed; ``--trace DIR`` also writes the profiler's
  timeline of one call of each op (``upsert_lf<LF>.json.gz``) and prints the
  longest CUDA runtime calls and the device's idle gaps in it.

    python benchmarks/profile_upsert_gpu.py --out benchmarks/results/upsert_profile_gpu
    python benchmarks/profile_upsert_gpu.py --smoke   # tiny, CPU, TRITON_INTERPRET
"""

from __future__ import annotations

import argparse
import cProfile
import io
import itertools
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
    p.add_argument("--runs", type=int, nargs="+", default=[1],
                   help="sorted positions per insert program (powers of two)")
    p.add_argument("--bi", type=int, nargs="+", default=[16],
                   help="keys of a run held in registers (powers of two)")
    p.add_argument("--block", type=int, nargs="+", default=[0],
                   help="block form: sorted positions per program (0: per-position form)")
    p.add_argument("--width", type=int, nargs="+", default=[4],
                   help="block form: longest run placed in tiles")
    p.add_argument("--trace", default=None, help="folder for the profiler timelines")
    add_out_and_smoke(p)
    args = parse_with_smoke(p)
    if args.smoke:
        args.slots, args.batch, args.dim, args.reps, args.warps = 4096, 300, 8, 1, [1]
        args.runs, args.bi, args.block, args.width = [1, 4], [16], [0, 16], [4]
    return args


ARGS = _args()
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from _table_fill import filled_index, random_keys  # noqa: E402
from _timing import command_line, environment, write_results  # noqa: E402

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


ALLOCATOR_COUNTERS = ("num_device_alloc", "num_device_free", "num_alloc_retries",
                      "num_sync_all_streams")


def _allocator() -> dict[str, int]:
    stats = torch.cuda.memory_stats() if CUDA else {}
    return {name: int(stats.get(name, 0)) for name in ALLOCATOR_COUNTERS}


def _timed(fn, batches, counters: dict | None = None) -> tuple[float, float]:
    """(median elapsed ms, median issue ms) of fn(batch) over the batches after 2 warm-ups;
    ``counters`` gets the allocator's counter changes over the timed calls."""
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
        if i == 1:
            before = _allocator()
        if i >= 2:
            issue.append((t1 - t0) * 1e3)
            elapsed.append(start.elapsed_time(end) if CUDA else issue[-1])
    if counters is not None:
        counters.update({k: v - before[k] for k, v in _allocator().items()})
    return statistics.median(elapsed), statistics.median(issue)


def _timeline(path: str) -> None:
    """Prints the longest CUDA runtime calls and the longest device idle gaps of a
    profiler timeline."""
    import gzip

    with gzip.open(path, "rt") as f:
        events = [e for e in json.load(f)["traceEvents"] if e.get("ph") == "X"]
    runtime = sorted((e for e in events if e.get("cat") == "cuda_runtime"),
                     key=lambda e: -e["dur"])[:10]
    print("longest CUDA runtime calls (us):", [(e["name"], round(e["dur"])) for e in runtime])
    device = sorted((e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")),
                    key=lambda e: e["ts"])
    gaps = sorted(((b["ts"] - (a["ts"] + a["dur"]), a["name"][:40], b["name"][:40])
                   for a, b in zip(device, device[1:])), reverse=True)[:10]
    busy = sum(e["dur"] for e in device)
    span = device[-1]["ts"] + device[-1]["dur"] - device[0]["ts"] if device else 0
    print(f"device: {len(device)} activities, busy {busy / 1e3:.3f} ms of a "
          f"{span / 1e3:.3f} ms span; longest idle gaps (us, after, before):",
          [(round(g), a, b) for g, a, b in gaps], flush=True)


def _profiles(ops: dict, batches, trace: str | None = None) -> None:
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if CUDA else [])
    with profile(activities=activities) as prof:
        for fn in ops.values():
            fn(batches[0])
        _sync()
    if trace:
        prof.export_chrome_trace(trace)
        if CUDA:
            _timeline(trace)
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


def _launches() -> list[tuple[str, dict, dict]]:
    """(name, UPSERT_CONFIG, UPSERT_BLOCK) of every launch to time."""
    out = []
    for block in ARGS.block:
        if block == 0:
            for runs, warps, bi in itertools.product(ARGS.runs, ARGS.warps, ARGS.bi):
                out.append((f"runs={runs} warps={warps} bi={bi}",
                            {"runs": runs, "num_warps": warps, "bi": bi}, {"block": 0}))
            continue
        for width, warps, bi in itertools.product(ARGS.width, ARGS.warps, ARGS.bi):
            out.append((f"block={block} width={width} warps={warps} bi={bi}", {"bi": bi},
                        {"block": block, "width": width, "num_warps": warps}))
    return out


def _timed_launch(fn, batches, config: dict, block: dict) -> float:
    """Median elapsed ms of ``fn`` under one insert-program launch (restored after)."""
    saved = dict(upsert_tt.UPSERT_CONFIG), dict(upsert_tt.UPSERT_BLOCK)
    try:
        upsert_tt.UPSERT_CONFIG.update(config)
        upsert_tt.UPSERT_BLOCK.update(block)
        return _timed(fn, batches)[0]
    finally:
        upsert_tt.UPSERT_CONFIG.update(saved[0])
        upsert_tt.UPSERT_BLOCK.update(saved[1])


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
        counters: dict[str, int] = {}
        row[name] = dict(zip(("elapsed_ms", "issue_ms"), _timed(fn, batches(), counters)))
        row[name]["allocator"] = counters
        print(f"load factor {lf}: {name} {json.dumps(row[name])}", flush=True)
    row["configs"] = {}
    for name, config, block in _launches():
        row["configs"][name] = _timed_launch(ops["insert_or_assign"], batches(), config, block)
        print(f"load factor {lf}: insert_or_assign {row['configs'][name]:.3f} ms with "
              f"{name}", flush=True)
    trace = None
    if ARGS.trace:
        os.makedirs(ARGS.trace, exist_ok=True)
        trace = os.path.join(ARGS.trace, f"upsert_lf{lf:g}.json.gz")
    _profiles(ops, batches(), trace)
    return row


def main() -> None:
    results = {"env": environment(), "command": command_line(), "slots": ARGS.slots,
               "batch": ARGS.batch, "dim": ARGS.dim, "rows": []}
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
        lines += ["", "insert_or_assign elapsed ms by insert-program launch:", "",
                  "| load factor | launch | elapsed ms |", "| --- | --- | --- |"]
        lines += [f"| {r['measured_load_factor']:.3f} | {name} | {ms:.3f} |"
                  for r in results["rows"] for name, ms in r["configs"].items()]
        env = results["env"]
        write_results(ARGS.out, results,
                      f"# Upsert time split on GPU\n\nCommand: `{results['command']}`\n\n"
                      f"Date {env['date']}, GPU {env['gpu']}, "
                      f"torch {env['torch']}, triton {env['triton']}; {results['slots']} "
                      f"slots, {results['batch']} keys per call, dim {results['dim']}.\n\n"
                      + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
