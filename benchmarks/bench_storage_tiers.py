"""Storage tiers on GPU: training-step throughput of one dynamic table in HBM_ONLY,
HYBRID and CACHING, and host-row bandwidth against plain pinned-memory gathers.

The layer benchmark's workload (``bench_embedding_layer``: power law alpha 1.05,
dim 128, 1,048,570 ids per step, 1,677,721 rows of capacity, keys from a range of
1,000,000) on ONE table, driven through the ``HashTable`` API that every storage
mode implements: per step dedup, ``lookup`` (find, insert misses, read rows),
gather per id, per-unique gradient sum and ``apply_gradients`` (SGD). Modes:
HBM_ONLY, then HYBRID and CACHING at each ``--factors`` cache_load_factor.

Baselines in the same run, over pinned host rows of the table's row width:
* ``pinned_index_select``: ``index_select`` on the pinned tensor (host gather with
  host indices) followed by a copy to the device;
* ``pinned_uva_gather``: a Triton gather reading pinned rows in place over UVA;
* ``pinned_copy``: a contiguous pinned -> device copy (interconnect peak).
HYBRID's host bandwidth is its read of one step's rows (device and host parts),
counted over the host rows only, next to the UVA gather of as many host rows.

    python3 benchmarks/bench_storage_tiers.py --out benchmarks/results/storage_tiers_gpu
    python3 benchmarks/bench_storage_tiers.py --smoke
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--factors", default="0.1,0.25,0.5", help="cache_load_factors to run")
    p.add_argument("--steps", type=int, default=8, help="timed steps per mode")
    p.add_argument("--out", default=None, help="path prefix of the .json and .md results")
    p.add_argument("--smoke", action="store_true", help="tiny sizes; runs on CPU")
    return p.parse_args()


ARGS = _args()
sys.path[:0] = [HERE, os.path.dirname(HERE)]
_argv, sys.argv = sys.argv, [sys.argv[0]] + (["--smoke"] if ARGS.smoke else [])
import bench_embedding_layer as layer  # noqa: E402  (workload, dedup, power-law batches)

sys.argv = _argv

import torch  # noqa: E402
from _timing import environment, time_ms, write_results  # noqa: E402

from hashrec.table import HashTable, SparseSGD, TableOptions  # noqa: E402
from hashrec.table.tiers.two_part import UVA, TwoPartRows, allocate_host  # noqa: E402

DEVICE = layer.DEVICE
LAYER = layer.ARGS
LAYER.tables = 1  # one table; ids, capacity, key range and alpha are the layer's
if ARGS.smoke:
    LAYER.dim, LAYER.ids, LAYER.capacity, LAYER.key_range = 8, 4000, 8192, 6000
    ARGS.steps = 3
FACTORS = [float(f) for f in ARGS.factors.split(",")]
SPEC = SparseSGD(lr=0.01)


def _log(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", flush=True)


def _sync() -> None:
    if DEVICE.type == "cuda":
        torch.cuda.synchronize()


class TableStep:
    """One training step of one table through the HashTable API."""

    def __init__(self, clf: float, caching: bool) -> None:
        self.table = HashTable(TableOptions(
            dim=LAYER.dim, max_capacity=LAYER.capacity, optimizer=SPEC, check_mode="IGNORE",
            cache_load_factor=clf, caching=caching, device=DEVICE, seed=0))

    def forward(self, ids: torch.Tensor):
        self.table.advance_step()
        d = layer.dedup(ids)
        result = self.table.lookup(d.unique, train=True, counts=d.row_start.diff())
        return result.values[d.inverse], d, result.slots

    def backward(self, grad: torch.Tensor, d, slots: torch.Tensor) -> None:
        per_key = torch.zeros(d.unique.numel(), grad.shape[1], device=DEVICE)
        per_key.index_add_(0, d.inverse, grad)
        stored = torch.nonzero(slots >= 0).flatten()
        self.table.apply_gradients(slots[stored], per_key[stored])

    def step(self, ids: torch.Tensor, grad: torch.Tensor) -> None:
        _, d, slots = self.forward(ids)
        self.backward(grad, d, slots)


def _run_mode(name: str, clf: float, caching: bool, batches, grad) -> dict:
    _log(f"{name}: building table (clf {clf}, caching {caching})")
    model = TableStep(clf, caching)
    for b in batches[:2]:  # fill: the first steps insert most keys
        model.step(b, grad)
    before = model.table.stats()
    _sync()
    step_ms = time_ms(lambda b: model.step(b, grad), len(batches) - 2, warmup=0,
                      setup=lambda i: batches[2 + i])
    after = model.table.stats()
    out = {"mode": name, "cache_load_factor": clf, "caching": caching, "step_ms": step_ms,
           "ids_per_s": batches[0].numel() / (step_ms * 1e-3),
           "memory": model.table.memory_report(), "size": after["size"]}
    for key in ("cache_lookups", "cache_hits", "fetched_rows", "written_back_rows",
                "host_direct_rows"):
        if key in after:
            out[key] = after[key] - before[key]
    if out.get("cache_lookups"):
        out["cache_hit_rate"] = out["cache_hits"] / out["cache_lookups"]
    if not caching and clf < 1.0:
        out.update(_hybrid_read(model.table, batches[-1]))
    _log(f"{name}: {step_ms:.2f} ms/step")
    return out


def _hybrid_read(table: HashTable, ids: torch.Tensor) -> dict:
    """Time of HYBRID's row read for one step's unique keys; host share of its bytes."""
    slots = table.lookup(torch.unique(ids), train=False).slots
    slots = slots[slots >= 0]
    rows = table._rows  # noqa: SLF001  (the benchmark measures the store itself)
    ms = time_ms(lambda: rows.read(slots, 0, LAYER.dim, admit=False), 5)
    host_rows = int((slots >= rows.split).sum())
    host_bytes = host_rows * LAYER.dim * 4
    return {"read_rows": slots.numel(), "read_host_rows": host_rows, "read_ms": ms,
            "read_host_Bps": host_bytes / (ms * 1e-3)}


def _pinned_baselines(rows: int, row_dim: int, unique: int) -> dict:
    """Gathers of ``unique`` random rows (dim columns) from a pinned (rows, row_dim) tensor."""
    _log("pinned baselines")
    host = allocate_host(rows, row_dim, torch.float32, DEVICE)
    index = torch.randperm(rows, device=DEVICE)[:unique]
    width = LAYER.dim
    row_bytes = unique * width * 4
    out = {"rows_gathered": unique, "bytes": row_bytes}
    host_index = index.cpu()

    def index_select():
        return host.index_select(0, host_index)[:, :width].to(DEVICE, non_blocking=False)

    out["pinned_index_select_ms"] = time_ms(index_select, 5)
    if DEVICE.type == "cuda":
        uva = TwoPartRows(torch.zeros(1, row_dim, device=DEVICE), host, 0, DEVICE)
        out["host_access"] = uva.mode
        if uva.mode == UVA:
            out["pinned_uva_gather_ms"] = time_ms(lambda: uva.gather(index, 0, width), 5)
        block = host[:unique]
        out["pinned_copy_ms"] = time_ms(lambda: block.to(DEVICE), 5)
        out["pinned_copy_Bps"] = block.numel() * 4 / (out["pinned_copy_ms"] * 1e-3)
    for key in ("pinned_index_select", "pinned_uva_gather"):
        if f"{key}_ms" in out:
            out[f"{key}_Bps"] = row_bytes / (out[f"{key}_ms"] * 1e-3)
    return out


def main() -> None:
    t0 = time.time()
    _log(f"device {DEVICE}; {LAYER.ids} ids/step, capacity {LAYER.capacity}, dim {LAYER.dim}")
    batches = [b.flatten() for b in layer._power_law_batches(ARGS.steps + 2)]  # noqa: SLF001
    grad = torch.randn(batches[0].numel(), LAYER.dim, device=DEVICE)
    unique = sum(torch.unique(b).numel() for b in batches) / len(batches)
    modes = [("HBM_ONLY", 1.0, False)]
    modes += [(f"HYBRID-{f}", f, False) for f in FACTORS]
    modes += [(f"CACHING-{f}", f, True) for f in FACTORS]
    rows = []
    for name, clf, caching in modes:
        rows.append(_run_mode(name, clf, caching, batches, grad))
        gc.collect()  # free the mode's table before the next one is built
        if DEVICE.type == "cuda":
            torch.cuda.empty_cache()
    hbm = rows[0]["step_ms"]
    for r in rows:
        r["throughput_vs_hbm"] = hbm / r["step_ms"]
    baselines = _pinned_baselines(LAYER.capacity, LAYER.dim + SPEC.state_dim(LAYER.dim),
                                  int(unique))
    results = {"env": environment(), "command": " ".join(["python3"] + sys.argv),
               "args": {**{k: v for k, v in vars(ARGS).items() if k != "out"},
                        "dim": LAYER.dim, "ids": LAYER.ids, "capacity": LAYER.capacity,
                        "key_range": LAYER.key_range, "alpha": LAYER.alpha,
                        "optimizer": "SGD"},
               "mean_unique_ids": unique, "modes": rows, "baselines": baselines,
               "wall_s": time.time() - t0}
    _write(results)


def _mode_table(rows: list[dict]) -> str:
    lines = ["| mode | ms/step | M ids/s | vs HBM_ONLY | cache hit rate | fetched rows | "
             "written back | host-direct rows | GPU MB | host MB | host access |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        mem = r["memory"]
        hit = f"{r['cache_hit_rate']:.3f}" if "cache_hit_rate" in r else "-"
        lines.append(
            f"| {r['mode']} | {r['step_ms']:.2f} | {r['ids_per_s'] / 1e6:.1f} | "
            f"{r['throughput_vs_hbm']:.2f} | {hit} | {r.get('fetched_rows', '-')} | "
            f"{r.get('written_back_rows', '-')} | {r.get('host_direct_rows', '-')} | "
            f"{mem['gpu'] / 2**20:.0f} | {mem['host'] / 2**20:.0f} | {mem['host_access']} |")
    return "\n".join(lines)


def _bandwidth_table(results: dict) -> str:
    base = results["baselines"]
    lines = ["| what | rows | ms | GB/s |", "| --- | --- | --- | --- |"]
    for key in ("pinned_index_select", "pinned_uva_gather"):
        if f"{key}_ms" in base:
            lines.append(f"| {key} | {base['rows_gathered']} | {base[f'{key}_ms']:.3f} | "
                         f"{base[f'{key}_Bps'] / 1e9:.1f} |")
    if "pinned_copy_ms" in base:
        lines.append(f"| pinned_copy (contiguous) | {base['rows_gathered']} | "
                     f"{base['pinned_copy_ms']:.3f} | {base['pinned_copy_Bps'] / 1e9:.1f} |")
    for r in results["modes"]:
        if "read_ms" in r:
            lines.append(f"| {r['mode']} read ({r['read_host_rows']} of {r['read_rows']} rows "
                         f"on host) | {r['read_rows']} | {r['read_ms']:.3f} | "
                         f"{r['read_host_Bps'] / 1e9:.1f} (host rows only) |")
    return "\n".join(lines)


def _write(results: dict) -> None:
    text = _mode_table(results["modes"]) + "\n\n" + _bandwidth_table(results)
    print(json.dumps(results), flush=True)
    print(text, flush=True)
    if not ARGS.out:
        return
    env, a = results["env"], results["args"]
    write_results(ARGS.out, results,
                  f"# Storage tiers on GPU\n\nCommand: `{results['command']}`\n\nDate "
                  f"{env['date']}, GPU {env['gpu']}, torch {env['torch']}, triton "
                  f"{env['triton']}. One table, dim {a['dim']}, SGD, {a['ids']} ids per step "
                  f"({results['mean_unique_ids']:.0f} unique on average) from a power law "
                  f"(alpha {a['alpha']}) over {a['key_range']} keys, capacity "
                  f"{a['capacity']}; median of {a['steps']} steps after 2 filling steps, "
                  f"through HashTable.lookup / apply_gradients.\n\n{text}\n")


if __name__ == "__main__":
    main()
