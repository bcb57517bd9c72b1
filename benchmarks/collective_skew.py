"""How long each rank's collectives wait for the others, from the ranks' profiler traces.

An NCCL kernel starts when its rank's stream reaches it and ends when every rank
has joined and the data has moved, so its device time is mostly waiting when the
ranks arrive at different times. This reads the timelines that
``profile_train_step.py --trace`` writes per rank under torchrun
(``<out>.rankR.trace.json.gz``; the ranks of one host share a clock), pairs the
ranks' NCCL kernels in launch order (every rank issues the same collectives in
the same order) and reports per collective kind:

* ``ms`` the kernel's mean device time per rank and call;
* ``wait`` the part before the last rank arrived (its start minus this rank's);
* ``after`` the part after the last rank arrived (the transfer itself);
* ``late`` how often each rank was the last to arrive, and ``idle before`` how long
  the last rank's device sat idle just before the kernel: a late rank with an idle
  device was held back by its host, a busy one by its own kernels.

Usage::

    torchrun --nproc_per_node 2 benchmarks/profile_train_step.py --data DIR \\
        --config dynamicemb --steps 10 --trace --out OUT/profile_x2
    python benchmarks/collective_skew.py --traces OUT/profile_x2 --out OUT/skew_x2
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import environment, write_results  # noqa: E402


def device_events(path: str) -> list[dict]:
    """The trace's device activities (kernels, copies, memsets), by start time."""
    with gzip.open(path, "rt") as f:
        events = json.load(f)["traceEvents"]
    out = [e for e in events if e.get("ph") == "X" and
           e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    return sorted(out, key=lambda e: e["ts"])


def collectives(events: list[dict]) -> list[tuple[str, float, float, float]]:
    """(kind, start, end, device idle just before) of every NCCL kernel, in order (us)."""
    out, busy_until = [], None
    for e in events:
        start, end = e["ts"], e["ts"] + e.get("dur", 0)
        if "nccl" in e["name"].lower():
            idle = max(0.0, start - busy_until) if busy_until is not None else 0.0
            kind = e["name"].split("(")[0].replace("ncclDevKernel_", "")
            out.append((kind, start, end, idle))
        busy_until = end if busy_until is None else max(busy_until, end)
    return out


def skew(per_rank: list[list[tuple]], steps: int) -> list[dict]:
    """Per collective kind: time, wait and lateness per rank (see the module docstring)."""
    count = min(len(c) for c in per_rank)
    world = len(per_rank)
    stats = collections.defaultdict(lambda: {"calls": 0, "ms": [0.0] * world,
                                             "wait": [0.0] * world, "after": [0.0] * world,
                                             "late": [0] * world, "idle_before": 0.0})
    for i in range(count):
        calls = [c[i] for c in per_rank]
        kind = calls[0][0]
        last = max(range(world), key=lambda r: calls[r][1])
        s = stats[kind]
        s["calls"] += 1
        s["late"][last] += 1
        s["idle_before"] += calls[last][3]
        for r, (_, start, end, _) in enumerate(calls):
            s["ms"][r] += (end - start) / 1000.0
            s["wait"][r] += (calls[last][1] - start) / 1000.0
            s["after"][r] += (end - calls[last][1]) / 1000.0
    rows = []
    for kind, s in sorted(stats.items(), key=lambda kv: -sum(kv[1]["ms"])):
        n = s["calls"]
        rows.append({"kind": kind, "calls_per_step": n / steps,
                     "ms_per_call": [round(v / n, 4) for v in s["ms"]],
                     "wait_ms_per_call": [round(v / n, 4) for v in s["wait"]],
                     "after_ms_per_call": [round(v / n, 4) for v in s["after"]],
                     "ms_per_step": [round(v / steps, 4) for v in s["ms"]],
                     "late_share": [round(v / n, 3) for v in s["late"]],
                     "late_idle_before_ms": round(s["idle_before"] / n / 1000.0, 4)})
    return rows


def markdown(results: dict) -> str:
    lines = ["# Collective waits per rank", "",
             f"{results['env']['date']}, {results['env']['gpu']}, torch "
             f"{results['env']['torch']}.", "",
             f"Traces: `{results['traces']}` ({results['steps']} profiled steps, "
             f"{results['world']} ranks). Per call, ms per rank (rank 0 / rank 1 ...):", "",
             "| collective | calls/step | ms/step | device ms | waiting | after the last "
             "arrived | last to arrive | late rank's idle before |",
             "|---|---:|---|---|---|---|---|---:|"]
    for r in results["rows"]:
        def fmt(values):
            return " / ".join(f"{v:.3f}" for v in values)
        lines.append(f"| `{r['kind']}` | {r['calls_per_step']:.1f} | {fmt(r['ms_per_step'])} "
                     f"| {fmt(r['ms_per_call'])} | {fmt(r['wait_ms_per_call'])} | "
                     f"{fmt(r['after_ms_per_call'])} | {fmt(r['late_share'])} | "
                     f"{r['late_idle_before_ms']:.3f} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--traces", required=True,
                   help="the --out prefix of profile_train_step.py under torchrun")
    p.add_argument("--steps", type=int, default=10, help="profiled steps in the traces")
    p.add_argument("--out", default=None, help="path prefix of the .json and .md results")
    args = p.parse_args(argv)
    paths = sorted(glob.glob(args.traces + ".rank*.trace.json.gz"),
                   key=lambda s: int(s.rsplit(".rank", 1)[1].split(".")[0]))
    if len(paths) < 2:
        p.error(f"found {len(paths)} rank traces at {args.traces}.rank*.trace.json.gz; need 2+")
    per_rank = [collectives(device_events(path)) for path in paths]
    kinds = [[c[0] for c in calls] for calls in per_rank]
    if any(k[:len(kinds[0])] != kinds[0][:len(k)] for k in kinds):
        print("warning: the ranks' collectives differ in order; pairing by position")
    results = {"env": environment(), "traces": args.traces, "world": len(paths),
               "steps": args.steps, "rows": skew(per_rank, args.steps)}
    text = markdown(results)
    print(text)
    if args.out:
        write_results(args.out, results, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
