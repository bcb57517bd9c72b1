"""Does the row kernel overlap the insert? ``upsert_assign`` taken apart on the GPU.

Per load factor (index filled directly, 64M slots) and dim, on fresh 1M-key batches
(60% present) from the filled index (restored between calls, untimed), the device time
of:

* ``upsert``: ``upsert_slots`` alone (no rows);
* ``rows_all`` / ``rows_present``: ``write_rows`` of every key's row / of the present
  keys' rows alone, at the slots a call left;
* ``assign_after``: ``upsert_assign`` with ``HASHREC_UPSERT_BESIDE`` 0 (the upsert, then
  the rows); ``assign_beside``: with it 1 (the present keys' rows beside the insert);
  ``assign_beside_p0``: beside, with the insert's stream at the default priority
  instead of the highest; ``assign_beside_sm<K>`` for each K of ``--per-sm``: beside,
  the row kernel in K programs a multiprocessor looping over tiles
  (``UPSERT_ROWS["per_sm"]``);

and the kernel timeline (torch.profiler: start, duration, stream) of one
``upsert_assign`` call beside, printed and kept in the JSON.

    python benchmarks/profile_upsert_rows.py --out benchmarks/results/upsert_rows_profile
    python benchmarks/profile_upsert_rows.py --smoke   # tiny, CPU, TRITON_INTERPRET
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import tempfile

from _cli import add_out_and_smoke, parse_with_smoke


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--slots", type=int, default=64 * 2 ** 20)
    p.add_argument("--batch", type=int, default=1_048_576)
    p.add_argument("--load-factors", type=float, nargs="+", default=[0.5])
    p.add_argument("--dims", type=int, nargs="+", default=[64, 128])
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--per-sm", type=int, nargs="+", default=[1, 2, 4, 8])
    add_out_and_smoke(p)
    args = parse_with_smoke(p)
    if args.smoke:
        args.slots, args.batch, args.dims, args.reps = 4096, 300, [8], 1
    return args


ARGS = _args()
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from _table_fill import filled_index, random_keys  # noqa: E402
from _timing import command_line, environment, time_device_ms, write_results  # noqa: E402

from hashrec.table.ops.insert import upsert as upsert_tt  # noqa: E402
from hashrec.table.ops.insert import upsert_rows  # noqa: E402
from hashrec.table.ops.insert.rows import write_rows  # noqa: E402
from hashrec.table.ops.insert.upsert import upsert_slots  # noqa: E402
from hashrec.table.storage import TableStorage  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _timeline(fn) -> list[dict]:
    """Kernels of one ``fn()`` call: name, start (us from the first), duration, stream."""
    if DEVICE.type != "cuda":
        return []
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        fn()
        torch.cuda.synchronize()
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "trace.json.gz")
        prof.export_chrome_trace(path)
        with gzip.open(path, "rt") as f:
            events = json.load(f)["traceEvents"]
    kernels = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e["ts"])
    start = kernels[0]["ts"] if kernels else 0
    return [{"name": e["name"][:48], "start_us": round(e["ts"] - start, 1),
             "us": round(e["dur"], 1), "stream": e.get("args", {}).get("stream")}
            for e in kernels]


def _assign(beside: int):
    def run(storage, keys, vals):
        upsert_rows.UPSERT_ROWS["beside"] = beside
        upsert_rows.upsert_assign(storage, keys, None, torch.ones_like(keys), vals, True)
    return run


def _bench(index: TableStorage, saved: list, stored: torch.Tensor, dim: int) -> dict:
    storage = TableStorage(index.num_buckets, index.bucket_capacity, index.keys, index.tags,
                           index.digests, index.scores,
                           torch.randn(index.capacity, dim, device=DEVICE))
    n, reps = ARGS.batch, ARGS.reps
    hits = int(0.6 * n)

    def batch() -> torch.Tensor:
        pick = stored[torch.randint(0, stored.numel(), (hits,), device=DEVICE)]
        return torch.cat([pick, random_keys(n - hits, DEVICE)])
    batches = [batch() for _ in range(2 * (reps + 2))]

    def fresh(i: int) -> torch.Tensor:
        for dst, src in zip((index.keys, index.tags, index.digests, index.scores), saved):
            dst.copy_(src)
        return batches[i]
    vals = torch.randn(n, dim, device=DEVICE)
    slots = upsert_slots(storage, batches[0], None, torch.ones_like(batches[0]), True).slots
    present = torch.where(torch.arange(n, device=DEVICE) < hits, slots, -1)
    times = {
        "upsert": time_device_ms(
            lambda k: upsert_slots(storage, k, None, torch.ones_like(k), True), reps,
            setup=fresh),
        "rows_all": time_device_ms(lambda: write_rows(storage.values, slots, None, vals), reps),
        "rows_present": time_device_ms(
            lambda: write_rows(storage.values, present, None, vals), reps)}
    for beside in (0, 1):
        op = _assign(beside)
        times[f"assign_{'beside' if beside else 'after'}"] = time_device_ms(
            lambda k, op=op: op(storage, k, vals), reps, setup=fresh)
    high = upsert_tt._insert_stream
    if DEVICE.type == "cuda":
        low = torch.cuda.Stream(DEVICE, priority=0)
        upsert_tt._insert_stream = lambda index: low
    times["assign_beside_p0"] = time_device_ms(lambda k: _assign(1)(storage, k, vals), reps,
                                               setup=fresh)
    upsert_tt._insert_stream = high
    for per_sm in ARGS.per_sm:
        upsert_rows.UPSERT_ROWS["per_sm"] = per_sm
        times[f"assign_beside_sm{per_sm}"] = time_device_ms(
            lambda k: _assign(1)(storage, k, vals), reps, setup=fresh)
    upsert_rows.UPSERT_ROWS["per_sm"] = 0
    fresh(0)
    timeline = _timeline(lambda: _assign(1)(storage, batches[1], vals))
    upsert_rows.UPSERT_ROWS["beside"] = 1
    return {"dim": dim, **{f"{k}_ms": t["device_ms"] for k, t in times.items()},
            "timeline": timeline}


def main() -> None:
    results = {"env": environment(), "command": command_line(), "slots": ARGS.slots,
               "batch": ARGS.batch, "rows": []}
    for lf in ARGS.load_factors:
        index, stored = filled_index(ARGS.slots, lf, DEVICE)
        saved = [t.clone() for t in (index.keys, index.tags, index.digests, index.scores)]
        for dim in ARGS.dims:
            row = {"load_factor": lf, **_bench(index, saved, stored, dim)}
            results["rows"].append(row)
            print(json.dumps({k: v for k, v in row.items() if k != "timeline"}), flush=True)
            for k in row["timeline"]:
                print(f"  {k['start_us']:8.1f} {k['us']:7.1f}  stream {k['stream']}  "
                      f"{k['name']}", flush=True)
    cols = ("upsert", "rows_all", "rows_present", "assign_after", "assign_beside",
            "assign_beside_p0", *(f"assign_beside_sm{k}" for k in ARGS.per_sm))
    lines = ["| load factor | dim | " + " | ".join(f"{c} ms" for c in cols) + " |",
             "| --- | --- |" + " --- |" * len(cols)]
    lines += [f"| {r['load_factor']} | {r['dim']} | "
              + " | ".join(f"{r[c + '_ms']:.3f}" for c in cols) + " |" for r in results["rows"]]
    print("\n".join(lines))
    if ARGS.out:
        env = results["env"]
        write_results(ARGS.out, results,
                      f"# upsert_assign taken apart\n\nCommand: `{results['command']}`\n\n"
                      f"Date {env['date']}, GPU {env['gpu']}, torch {env['torch']}, triton "
                      f"{env['triton']}; {ARGS.slots} slots, {ARGS.batch} keys a call (60% "
                      "present), device time (`_timing.time_device_ms`); kernel timelines "
                      "in the JSON.\n\n" + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
