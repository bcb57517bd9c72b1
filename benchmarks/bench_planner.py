"""Storage planner speed: seconds to plan N dynamic tables with 20 variant candidates each.

Builds N tables of mixed sizes, dims and optimizers (seeded), with budgets that
leave the search real work (GPU for part of the values, host for the rest), and
times ``plan_tables`` end to end: variant enumeration (2 modes x 10
cache_load_factors, the two at 1.0 being one HBM_ONLY), byte estimates, cost
model and search. Also reports how far the plan's cost is above the Lagrangian
lower bound (how much better any plan could be).

    python benchmarks/bench_planner.py --json benchmarks/results/planner_cpu.json \\
        --markdown benchmarks/results/planner_cpu.md
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import statistics
import time

import numpy as np
import torch

from hashrec.distributed.planner import enumerate_variants, plan_tables
from hashrec.distributed.storage_estimate import PlannerTable
from hashrec.distributed.topology import Topology
from hashrec.table import SparseAdagrad, SparseAdam, SparseRowWiseAdagrad, SparseSGD, TableOptions

OPTIMIZERS = (SparseSGD(lr=0.1), SparseAdagrad(lr=0.1), SparseRowWiseAdagrad(lr=0.1),
              SparseAdam(lr=0.01))


def make_tables(n: int, seed: int) -> list[PlannerTable]:
    rng = random.Random(seed)
    tables = []
    for i in range(n):
        options = TableOptions(dim=rng.choice([8, 16, 32, 64, 128]),
                               max_capacity=rng.choice([1 << 16, 1 << 18, 1 << 20, 1 << 22]),
                               optimizer=rng.choice(OPTIMIZERS))
        tables.append(PlannerTable(name=f"table_{i:03d}", options=options,
                                   ids_per_sample=rng.choice([1.0, 4.0, 20.0])))
    return tables


def budgets(tables: list[PlannerTable], gpu_share: float, host_share: float) -> Topology:
    full = [t.full_estimate() for t in tables]
    index, values = sum(f["index"] for f in full), sum(f["values"] for f in full)
    return Topology(gpu_bytes=int(index + gpu_share * values), host_bytes=int(host_share * values))


def lagrangian_bound(tables, topology, batch_size) -> float:
    """max over prices (a, b) of sum_t min_v(cost + a gpu + b host) - a G - b H."""
    rows = [enumerate_variants(t, batch_size) for t in tables]
    width = max(len(r) for r in rows)
    cost, gpu, host = (np.full((len(rows), width), np.inf) for _ in range(3))
    for i, row in enumerate(rows):
        for j, v in enumerate(row):
            cost[i, j], gpu[i, j], host[i, j] = v.cost, v.gpu_bytes, v.host_bytes
    gpu, host = np.where(np.isfinite(gpu), gpu, 0), np.where(np.isfinite(host), host, 0)
    scale = np.nanmin(cost, axis=1).sum()
    prices_b = np.concatenate([[0.0], np.logspace(-4, 4, 161)]) * scale / max(topology.host_bytes, 1)
    best = -np.inf
    for a in np.concatenate([[0.0], np.logspace(-4, 4, 161)]) * scale / topology.gpu_bytes:
        dual = (cost[None] + a * gpu[None] + prices_b[:, None, None] * host[None]).min(axis=2)
        best = max(best, float((dual.sum(axis=1) - a * topology.gpu_bytes
                                - prices_b * topology.host_bytes).max()))
    return best


def run(num_tables: int, shares: list[tuple[float, float]], reps: int, batch_size: int) -> list:
    tables = make_tables(num_tables, seed=num_tables)
    results = []
    for gpu_share, host_share in shares:
        topology = budgets(tables, gpu_share, host_share)
        times = []
        for _ in range(reps):
            start = time.perf_counter()
            plan = plan_tables(tables, topology, batch_size)
            times.append(time.perf_counter() - start)
        candidates = sum(len(enumerate_variants(t, batch_size)) + 1 for t in tables)
        bound = lagrangian_bound(tables, topology, batch_size)
        modes = {}
        for entry in plan.tables:
            modes[entry.variant.mode.value] = modes.get(entry.variant.mode.value, 0) + 1
        results.append({
            "tables": num_tables, "gpu_share": gpu_share, "host_share": host_share,
            "candidates": candidates, "seconds_median": statistics.median(times),
            "seconds_max": max(times), "plan_cost_s": plan.cost, "lower_bound_s": bound,
            "gap_to_bound": plan.cost / bound - 1.0, "modes": modes,
            "gpu_used": plan.gpu_bytes / topology.gpu_bytes,
            "host_used": plan.host_bytes / max(topology.host_bytes, 1)})
    return results


def environment() -> dict:
    return {"date": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "cpus": os.cpu_count(),
            "platform": platform.platform(), "python": platform.python_version(),
            "torch": torch.__version__, "numpy": np.__version__}


def markdown(env: dict, results: list, batch_size: int) -> str:
    lines = ["# Storage planner speed", "",
             f"{env['date']}, {env['cpus']} CPUs ({env['platform']}), python {env['python']}, "
             f"torch {env['torch']}, numpy {env['numpy']}.", "",
             f"Per-rank batch size {batch_size}. Budgets: GPU = index + gpu share of all values, "
             "host = host share of all values. 20 candidates per table (2 modes x 10 load "
             "factors; the two at 1.0 are the same HBM_ONLY variant).", "",
             "| tables | GPU share | host share | candidates | median s | max s | "
             "gap to lower bound | modes | GPU used | host used |",
             "|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|"]
    for r in results:
        modes = ", ".join(f"{k} {v}" for k, v in sorted(r["modes"].items()))
        lines.append(
            f"| {r['tables']} | {r['gpu_share']:.2f} | {r['host_share']:.2f} | {r['candidates']} "
            f"| {r['seconds_median']:.3f} | {r['seconds_max']:.3f} | "
            f"{100 * r['gap_to_bound']:.2f}% | {modes} | {100 * r['gpu_used']:.1f}% | "
            f"{100 * r['host_used']:.1f}% |")
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", type=int, nargs="+", default=[10, 100, 300])
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--batch_size", type=int, default=8192)
    parser.add_argument("--json")
    parser.add_argument("--markdown")
    args = parser.parse_args()
    shares = [(0.2, 0.9), (0.5, 0.6), (0.8, 0.3), (2.0, 2.0)]
    env = environment()
    results = [r for n in args.tables for r in run(n, shares, args.reps, args.batch_size)]
    for r in results:
        print(json.dumps(r))
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"environment": env, "batch_size": args.batch_size, "results": results},
                      f, indent=2)
    if args.markdown:
        with open(args.markdown, "w") as f:
            f.write(markdown(env, results, args.batch_size))


if __name__ == "__main__":
    main()
