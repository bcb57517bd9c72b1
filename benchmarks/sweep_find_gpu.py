"""Sweep of find probe variants and launch configs, each checked against the reference.

The table is filled directly (random keys placed by a vectorized bucket sort, no
insert kernel), then for each load factor and dim every variant runs
``find_values`` on the same batch (60% present) and its slots are compared with
``reference.find_slots`` and its rows with the table's. Variants:

* ``words``: the shipped probe (digest line as 32-bit words, exact SWAR byte match,
  two candidates per round) at each BLOCKxWARPS config;
* ``bytes``: the same probe on the digest bytes (the fallback for bucket
  capacities that are not a multiple of 4);
* ``default launch``: ``words`` at the launch the library picks (the last row).

Each variant is timed as 20 launches issued back to back (the device's throughput,
as bench_table_gpu.py's main figure), ``find_values`` end to end as the median of
``--reps`` single calls between syncs; in B-KV/s (1e9 keys per second).

    python benchmarks/sweep_find_gpu.py --out benchmarks/results/find_sweep_gpu
    python benchmarks/sweep_find_gpu.py --smoke   # tiny, CPU, TRITON_INTERPRET
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from _cli import add_out_and_smoke, launch_config, parse_with_smoke


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--slots", type=int, default=64 * 2 ** 20)
    p.add_argument("--batch", type=int, default=1_048_576)
    p.add_argument("--load-factors", type=float, nargs="+", default=[0.5, 0.75, 1.0])
    p.add_argument("--dims", type=int, nargs="+", default=[8, 128])
    p.add_argument("--configs", nargs="+",
                   default=["32x2", "32x4", "64x2", "64x4", "64x8", "128x4", "128x8", "256x8"],
                   help="launches BLOCKxWARPS, optionally rREGS: at most REGS registers a "
                        "thread (Triton's maxnreg), then w: the probe by word, e.g. 64x2r64w")
    p.add_argument("--kinds", nargs="+", default=["words", "bytes"],
                   choices=["words", "bytes"], help="probe variants to time")
    p.add_argument("--reps", type=int, default=10)
    add_out_and_smoke(p)
    args = parse_with_smoke(p)
    if args.smoke:
        args.slots, args.batch, args.dims, args.reps = 4096, 300, [8], 1
        args.configs = ["32x4"]
    return args


ARGS = _args()
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
import triton  # noqa: E402
from _table_fill import CAP, filled_index, random_keys  # noqa: E402
from _timing import command_line, environment, time_ms, write_results  # noqa: E402

from hashrec.table.ops.find import reference  # noqa: E402
from hashrec.table.ops.find import triton as find_tt  # noqa: E402
from hashrec.table.ops.launch import maxnreg  # noqa: E402
from hashrec.table.storage import TableStorage  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _bytes_config(storage: TableStorage, keys: torch.Tensor, values: torch.Tensor,
                  slots: torch.Tensor, block: int, warps: int, regs: int) -> None:
    """The probe on digest bytes (WORDS=False) into preallocated outputs."""
    n, dim = keys.numel(), values.shape[1]
    dim_p2 = triton.next_power_of_2(dim)
    block = max(1, min(block, 16384 // max(CAP, dim_p2)))
    find_tt._find_kernel[(triton.cdiv(n, block),)](
        keys, keys, storage.keys, storage.tags, storage.digests, storage.values, slots, values,
        n, storage.num_buckets, HAS_TAGS=False, WITH_VALUES=True, CAP=CAP,
        LINE=CAP, ROUND=1,
        WORDS=False, POW2=True, ROW_DIM=storage.row_dim, DIM=dim, DIM_P2=dim_p2, BY_WORD=False,
        MASKS=False,
        BLOCK=block,
        num_warps=warps, **maxnreg(regs))


def _variants() -> dict:
    out = {}
    for cfg in ARGS.configs:
        config = launch_config(cfg)
        block, warps, regs = config["block"], config["num_warps"], config["maxnreg"]
        for kind in ARGS.kinds:
            if kind == "bytes":
                out[f"bytes {cfg}"] = (lambda b, w, r: lambda s, k, v, o: _bytes_config(
                    s, k, v, o, b, w, r))(block, warps, regs)
                continue
            out[f"{kind} {cfg}"] = (lambda c: lambda s, k, v, o: find_tt.launch_find(
                s, k, None, o, v, c))(config)
    return out


def _e2e(storage: TableStorage, probe: torch.Tensor, dim: int):
    return lambda: find_tt.find_values(storage, probe, None, dim)


def _back_to_back_ms(fn, calls: int = 20) -> float:
    """Milliseconds per call of ``calls`` launches issued without syncs."""
    if DEVICE.type != "cuda":
        return time_ms(fn, 1)
    fn()
    torch.cuda.synchronize()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    for _ in range(calls):
        fn()
    end.record()
    torch.cuda.synchronize()
    return start.elapsed_time(end) / calls


def sweep_dim(index: TableStorage, stored: torch.Tensor, dim: int) -> dict:
    storage = TableStorage(index.num_buckets, CAP, index.keys, index.tags, index.digests,
                           index.scores, torch.randn(index.capacity, dim, device=DEVICE))
    n = ARGS.batch
    hits = int(0.6 * n)
    probe = torch.cat([stored[torch.randint(0, stored.numel(), (hits,), device=DEVICE)],
                       random_keys(n - hits, DEVICE)])
    expected = reference.find_slots(storage, probe)
    slots = torch.empty(n, dtype=torch.int64, device=DEVICE)
    values = torch.empty(n, dim, device=DEVICE)
    row = {"dim": dim, "hit_rate": float((expected >= 0).float().mean()), "bkvs": {}}
    hit = expected >= 0
    want_rows = storage.values[expected[hit]]
    for name, fn in _variants().items():
        slots.fill_(-7)
        values.fill_(-7.0)
        fn(storage, probe, values, slots)
        if not (torch.equal(slots, expected) and torch.equal(values[hit], want_rows)
                and bool((values[~hit] == 0).all())):
            row["bkvs"][name] = "MISMATCH"
            continue
        row["bkvs"][name] = n / _back_to_back_ms(
            lambda f=fn: f(storage, probe, values, slots)) / 1e6
    got, vals = find_tt.find_values(storage, probe, None, dim)
    ok = torch.equal(got, expected) and torch.equal(vals[expected >= 0],
                                                    storage.values[expected[expected >= 0]])
    row["bkvs"]["find_values (end to end)"] = (
        n / time_ms(_e2e(storage, probe, dim), ARGS.reps) / 1e6 if ok else "MISMATCH")
    row["bkvs"]["default launch"] = n / _back_to_back_ms(
        lambda: find_tt.launch_find(storage, probe, None, slots, values)) / 1e6
    return row


def main() -> None:
    results = {"env": environment(), "command": command_line(), "slots": ARGS.slots,
               "batch": ARGS.batch, "bucket_capacity": CAP, "rows": []}
    for lf in ARGS.load_factors:
        index, stored = filled_index(ARGS.slots, lf, DEVICE)
        real_lf = index.size() / index.capacity
        for dim in ARGS.dims:
            row = {"load_factor": lf, "measured_load_factor": real_lf}
            row.update(sweep_dim(index, stored, dim))
            results["rows"].append(row)
            print(json.dumps(row), flush=True)
        del index, stored
    _write(results)


def _write(results: dict) -> None:
    names = list(results["rows"][0]["bkvs"])
    lines = ["| variant | " + " | ".join(
        f"lf {r['measured_load_factor']:.2f} dim {r['dim']}" for r in results["rows"]) + " |",
        "| --- |" + " --- |" * len(results["rows"])]
    for name in names:
        cells = [r["bkvs"][name] for r in results["rows"]]
        lines.append(f"| {name} | " + " | ".join(
            c if isinstance(c, str) else f"{c:.2f}" for c in cells) + " |")
    table = "\n".join(lines)
    print(table)
    if ARGS.out:
        env = results["env"]
        write_results(ARGS.out, results,
                      f"# find variants on GPU (B-KV/s)\n\nCommand: `{results['command']}`\n\n"
                      f"Date {env['date']}, GPU {env['gpu']}, torch {env['torch']}, triton "
                      f"{env['triton']}; {results['slots']} slots (bucket {CAP}), "
                      f"{results['batch']} keys per call, 60% present; every variant's "
                      f"slots and rows equal the reference's (else MISMATCH).\n\n{table}\n")


if __name__ == "__main__":
    main()
