"""Where a public ``HashTable`` call's time goes on a GPU: kernels, host syncs, host issue.

Benchmark A times the table's kernels (``bench_table_gpu.py``); a user calls
``HashTable.find`` / ``find_or_insert`` / ``insert_or_assign``, which validate,
deduplicate and count around them. For each op this times the call between device
syncs (median of ``--reps``; the same batches as ``bench_table.py``: find every key
present, the writes half present and half new, the new keys erased after each call,
untimed), then ``--loop`` calls back to back with one sync after them (a caller's
loop: the host issues a call while the device runs the one before, unless the call
waits on the device; the writes' new keys erased after the loop), then profiles one
call with ``torch.profiler``: the device time of its kernels and copies by name, and
the host's calls that may wait on the device (stream and device syncs, and copies,
which include device-to-device ones).

Usage::

    python benchmarks/profile_table_api.py --dims 32 128 --out OUT/table_api
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cli import add_out_and_smoke, parse_with_smoke  # noqa: E402

SYNC_CALLS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaEventSynchronize")


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--capacity", type=int, default=1 << 26)
    p.add_argument("--batch", type=int, default=1 << 20)
    p.add_argument("--dims", type=int, nargs="+", default=[32, 128])
    p.add_argument("--load-factor", type=float, default=0.5)
    p.add_argument("--reps", type=int, default=10)
    p.add_argument("--loop", type=int, default=10, help="calls back to back")
    p.add_argument("--top", type=int, default=12, help="kernels listed per op")
    add_out_and_smoke(p)
    args = parse_with_smoke(p)
    if args.smoke:  # the Triton path (interpreted) at tiny sizes
        os.environ.setdefault("HASHREC_FORCE_TRITON", "1")
        args.capacity, args.batch, args.dims, args.reps, args.loop = 4096, 256, [8], 1, 1
    return args


ARGS = _args()

import torch  # noqa: E402
from _timing import command_line, environment, write_results  # noqa: E402

from hashrec.table import HashTable, TableOptions  # noqa: E402

I64 = torch.iinfo(torch.int64)


def _sync() -> None:
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def _table(dim: int, args: argparse.Namespace, device: torch.device) -> HashTable:
    table = HashTable(TableOptions(dim=dim, max_capacity=args.capacity, device=device,
                                   score_strategy="STEP", check_mode="IGNORE"))
    target, chunk = int(args.capacity * args.load_factor), 1 << 20
    while table.size() < target:
        n = min(chunk, target - table.size())
        keys = torch.randint(I64.min, I64.max, (n,), device=device)
        table.insert_or_assign(keys, torch.zeros(n, dim, device=device))
    return table


def _present(table: HashTable, n: int) -> torch.Tensor:
    keys = torch.cat([batch[0] for batch in table.export_batch(1 << 24)])
    return keys[torch.randint(0, keys.numel(), (n,), device=keys.device)]


def _calls(table: HashTable, op: str, present: torch.Tensor, batch: int, dim: int):
    """(call, after) pairs: ``call`` is timed, ``after`` (untimed) restores the table."""
    device = present.device
    half = batch // 2
    new = torch.randint(I64.min, I64.max, (batch - half,), device=device)
    keys = torch.cat([present[:half], new])
    values = torch.randn(batch, dim, device=device)
    if op == "find":
        return (lambda: table.find(present[:batch])), (lambda: None)
    if op == "find_or_insert":
        return (lambda: table.find_or_insert(keys)), (lambda: table.erase(new))
    return (lambda: table.insert_or_assign(keys, values)), (lambda: table.erase(new))


def _profile(call) -> dict:
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU]
    if torch.cuda.is_available():
        activities.append(ProfilerActivity.CUDA)
    _sync()
    with profile(activities=activities) as prof:
        call()
        _sync()
    kernels, syncs = defaultdict(float), defaultdict(int)
    for event in prof.events():
        name = event.name
        if any(name.startswith(s) for s in SYNC_CALLS) or name == "cudaMemcpyAsync":
            syncs[name] += 1
        if event.device_type == torch.autograd.DeviceType.CUDA:
            kernels[name[:80]] += event.device_time_total / 1e3
    # The closing sync is the profile's own.
    for name in SYNC_CALLS:
        if syncs.get(name):
            syncs[name] -= 1
            break
    return {"kernels_ms": dict(sorted(kernels.items(), key=lambda kv: -kv[1])),
            "device_ms": sum(kernels.values()), "host_waits": dict(syncs)}


def _measure(table, op: str, present, dim: int, args) -> dict:
    """One op at one dim: median call between syncs, a loop of calls, one profiled call."""
    times, warmup = [], 0 if args.smoke else 2  # interpreted kernels need no warm-up
    for rep in range(args.reps + warmup):
        table.advance_step()
        call, after = _calls(table, op, present, args.batch, dim)
        _sync()
        start = time.perf_counter()
        call()
        _sync()
        if rep >= warmup:
            times.append((time.perf_counter() - start) * 1e3)
        after()
    pairs = [_calls(table, op, present, args.batch, dim) for _ in range(args.loop)]
    _sync()
    start = time.perf_counter()
    for call, _ in pairs:
        call()
    _sync()
    loop_ms = (time.perf_counter() - start) * 1e3 / args.loop
    for _, after in pairs:
        after()
    call, after = _calls(table, op, present, args.batch, dim)
    prof = _profile(call)
    after()
    ms = statistics.median(times)
    print(f"dim {dim} {op}: {ms:.3f} ms a call ({args.batch / ms / 1e6:.2f} B-KV/s), "
          f"{loop_ms:.3f} in a loop, kernels {prof['device_ms']:.3f} ms, host waits "
          f"{prof['host_waits']}", flush=True)
    return {"dim": dim, "op": op, "call_ms": ms, "min_ms": min(times),
            "bkvs": args.batch / ms / 1e6, "loop_ms": loop_ms,
            "loop_bkvs": args.batch / loop_ms / 1e6, **prof}


def _report(rows: list[dict], env: dict, args) -> str:
    lines = ["# HashTable calls on the GPU: time, kernels, host waits", "",
             f"Command: `{command_line()}`", "",
             f"Date {env['date']}, GPU {env['gpu']}, torch {env['torch']}, triton "
             f"{env['triton']}; {args.capacity} slots at load factor {args.load_factor}, "
             f"{args.batch} keys a call (find: all present; the writes: half present, half "
             f"new). Call: between device syncs, median of {args.reps}; loop: {args.loop} "
             f"calls back to back, one sync after them. Kernels: the device time of one "
             f"profiled call's kernels and copies.", "",
             "| dim | op | call ms (min) | B-KV/s | loop ms a call | B-KV/s | kernels ms | "
             "host calls that may wait |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        waits = ", ".join(f"{k} {v}" for k, v in r["host_waits"].items() if v) or "none"
        lines.append(f"| {r['dim']} | {r['op']} | {r['call_ms']:.3f} ({r['min_ms']:.3f}) | "
                     f"{r['bkvs']:.2f} | {r['loop_ms']:.3f} | {r['loop_bkvs']:.2f} | "
                     f"{r['device_ms']:.3f} | {waits} |")
    for r in rows:
        lines += ["", f"## dim {r['dim']}, {r['op']}: kernels (ms)", ""]
        lines += [f"- {ms:.3f} `{name}`" for name, ms in
                  list(r["kernels_ms"].items())[:args.top]]
    return "\n".join(lines) + "\n"


def main() -> None:
    args = ARGS
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    rows = []
    for dim in args.dims:
        table = _table(dim, args, device)
        present = _present(table, args.batch)
        for op in ("find", "find_or_insert", "insert_or_assign"):
            rows.append(_measure(table, op, present, dim, args))
        del table
        torch.cuda.empty_cache() if torch.cuda.is_available() else None
    env = environment()
    text = _report(rows, env, args)
    print(text)
    if args.out:
        write_results(args.out, {"env": env, "args": vars(args), "rows": rows}, text)


if __name__ == "__main__":
    main()
