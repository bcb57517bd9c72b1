"""Throughput of HashTable.find / find_or_insert / insert_or_assign.

For each device, dim and load factor, a table of ``--capacity`` slots is filled to
the load factor with random int64 keys, then timed on batches of ``--batch`` keys:

* find: every key present.
* find_or_insert: half present, half new; the new keys are erased (untimed) after
  each repetition so the load factor stays put. At load factor 1.0 inserts evict.
* insert_or_assign: the same half/half batches with fresh values.

Reports the fastest of ``--reps`` repetitions (after one warm-up) and the median.
Prints one line per measurement and writes JSON (date, torch, triton, device,
load average at the start, so contended runs can be spotted).

Usage::

    python benchmarks/bench_table.py --out benchmarks/results/table_cpu.json
    python benchmarks/bench_table.py --dims 16 --load-factors 0.75   # the target config
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import sys
import time

import torch

from hashrec.table import HashTable, TableOptions

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _timed(device: torch.device, fn) -> float:
    _sync(device)
    start = time.perf_counter()
    fn()
    _sync(device)
    return time.perf_counter() - start


def _fill(table: HashTable, count: int, gen: torch.Generator, device: torch.device) -> None:
    chunk = 1 << 20
    for start in range(0, count, chunk):
        n = min(chunk, count - start)
        keys = torch.randint(INT64_MIN, INT64_MAX, (n,), generator=gen).to(device)
        table.insert_or_assign(keys, torch.zeros(n, table.dim, device=device))


def _present_keys(table: HashTable, count: int, gen: torch.Generator) -> torch.Tensor:
    keys = torch.cat([batch[0] for batch in table.export_batch(1 << 22)])
    pick = torch.randint(0, keys.numel(), (count,), generator=gen).to(keys.device)
    return keys[pick]


def bench_one(device: torch.device, dim: int, load_factor: float, capacity: int, batch: int,
              reps: int) -> list[dict]:
    """Returns one record per op for this (device, dim, load factor)."""
    gen = torch.Generator().manual_seed(0)
    table = HashTable(TableOptions(dim=dim, max_capacity=capacity, device=device,
                                   score_strategy="STEP", check_mode="IGNORE"))
    _fill(table, int(capacity * load_factor), gen, device)
    measured_load = table.load_factor()
    records = []

    def record(op: str, seconds: list[float]) -> None:
        # The fastest repetition: on a shared machine other processes only slow runs down.
        best = min(seconds)
        records.append({"op": op, "device": device.type, "dim": dim,
                        "load_factor": load_factor, "measured_load_factor": measured_load,
                        "capacity": table.capacity(), "batch": batch, "best_s": best,
                        "median_s": sorted(seconds)[len(seconds) // 2],
                        "keys_per_s": batch / best})
        print(f"{device.type:5s} dim={dim:4d} lf={load_factor:.2f} {op:17s} "
              f"{batch / best / 1e6:8.2f} M keys/s")

    present = _present_keys(table, batch * (reps + 1), gen)
    times = [_timed(device, lambda i=i: table.find(present[i * batch:(i + 1) * batch]))
             for i in range(reps + 1)]
    record("find", times[1:])
    for op in ("find_or_insert", "insert_or_assign"):
        times = []
        for i in range(reps + 1):
            new = torch.randint(INT64_MIN, INT64_MAX, (batch - batch // 2,), generator=gen)
            keys = torch.cat([present[i * batch:i * batch + batch // 2], new.to(device)])
            table.advance_step()
            if op == "find_or_insert":
                times.append(_timed(device, lambda k=keys: table.find_or_insert(k)))
            else:
                values = torch.randn(batch, dim, generator=gen).to(device)
                times.append(_timed(device,
                                    lambda k=keys, v=values: table.insert_or_assign(k, v)))
            table.erase(new.to(device))
        record(op, times[1:])
    return records


def _versions() -> dict:
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {"date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "torch": torch.__version__, "triton": triton_version,
            "python": platform.python_version(), "machine": platform.machine(),
            "processor": platform.processor(), "cpu_threads": torch.get_num_threads(),
            "load_average": list(os.getloadavg()) if hasattr(os, "getloadavg") else None}


def markdown(report: dict, command: str) -> str:
    """A markdown summary of a report: command, versions, one row per measurement."""
    meta = report["meta"]
    lines = [
        "# HashTable throughput", "",
        f"Command: `{command}`", "",
        f"Date: {meta['date']}; devices: {', '.join(meta['devices'])}; torch {meta['torch']}; "
        f"triton {meta['triton']}; Python {meta['python']}; {meta['cpu_threads']} CPU threads; "
        f"load average at start: {meta['load_average']}.", "",
        "Keys/s is the fastest of the timed repetitions (the median is in the JSON).", "",
        "| device | dim | load factor (measured) | op | M keys/s |",
        "|---|---|---|---|---|",
    ]
    for r in report["results"]:
        lines.append(f"| {r['device']} | {r['dim']} | {r['load_factor']} "
                     f"({r['measured_load_factor']:.3f}) | {r['op']} | "
                     f"{r['keys_per_s'] / 1e6:.2f} |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--devices", default="auto", help="cpu, cuda, or auto (cpu + cuda)")
    parser.add_argument("--dims", default="8,32,64,128")
    parser.add_argument("--load-factors", default="0.5,0.75,1.0")
    parser.add_argument("--capacity", type=int, default=1 << 22)
    parser.add_argument("--batch", type=int, default=1 << 18)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--out", default=None, help="JSON output path")
    parser.add_argument("--md", default=None, help="markdown summary path")
    args = parser.parse_args()
    devices = ["cpu", "cuda"] if args.devices == "auto" else args.devices.split(",")
    devices = [torch.device(d) for d in devices
               if d != "cuda" or torch.cuda.is_available()]
    meta = _versions()
    meta["devices"] = [torch.cuda.get_device_name(d) if d.type == "cuda" else meta["processor"]
                       or meta["machine"] for d in devices]
    records = []
    for device in devices:
        for dim in (int(d) for d in args.dims.split(",")):
            for lf in (float(x) for x in args.load_factors.split(",")):
                records += bench_one(device, dim, lf, args.capacity, args.batch, args.reps)
    report = {"meta": meta, "args": vars(args), "results": records}
    if args.out:
        with open(args.out, "w") as handle:
            json.dump(report, handle, indent=1)
    if args.md:
        with open(args.md, "w") as handle:
            handle.write(markdown(report, "python " + " ".join(sys.argv)))


if __name__ == "__main__":
    main()
