"""Data-parallel scaling of training: the same config on 1 and on N GPUs in one call.

Runs ``bench_train`` (the real trainer under torchrun, step timing on) for the
dynamicemb example config at ``--batch_size`` per GPU, first on one process and
then on ``--nproc`` processes, and reports global samples/s of each, the
speed-up (target on 2 GPUs: >= 1.8x) and the all-to-all time per step of the
sharded embedding exchanges (from the trainer's progress log, ``a2a ... ms/step``).
Writes ``scaling_<device>_x<N>.json`` and ``.md`` to ``--out_dir``.

Usage::

    python benchmarks/bench_scaling.py --nproc 2 --out_dir benchmarks/results
    python benchmarks/bench_scaling.py --nproc 2 --smoke     # tiny CPU run (gloo)
"""

from __future__ import annotations

import argparse
import json
import os
import sys

import bench_train


def parse_args(argv=None) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, default=2, help="GPUs of the multi-process run")
    p.add_argument("--config", default="dynamicemb", choices=sorted(bench_train.CONFIGS))
    p.add_argument("--out_dir", default=os.path.join(bench_train.ROOT, "benchmarks", "results"))
    return p.parse_known_args(argv)


def _run(nproc: int, config: str, out_dir: str, passthrough: list[str]) -> dict:
    """One bench_train call; returns its report (written under ``out_dir``)."""
    argv = ["--nproc", str(nproc), "--configs", config, "--out_dir", out_dir, *passthrough]
    if bench_train.main(argv):
        raise RuntimeError(f"bench_train failed for --nproc {nproc}")
    smoke = "smoke_" if "--smoke" in passthrough else ""
    device = "gpu" if bench_train._cuda() else "cpu"
    name = f"train_{smoke}{device}" + (f"_x{nproc}" if nproc > 1 else "")
    with open(os.path.join(out_dir, name + ".json"), encoding="utf-8") as f:
        return json.load(f)


def summarize(single: dict, multi: dict, config: str, nproc: int) -> dict:
    one, many = single["runs"][config], multi["runs"][config]
    rate1 = one.get("global_samples_per_second") or 0.0
    rate_n = many.get("global_samples_per_second") or 0.0
    return {"config": config, "nproc": nproc, "per_gpu_batch": many.get("per_gpu_batch"),
            "samples_per_second": {"1": rate1, str(nproc): rate_n},
            "speedup": rate_n / rate1 if rate1 else None,
            "a2a_ms_per_step": many.get("a2a_ms_per_step"),
            "step_ms": {"1": one.get("phases_ms", {}).get("step"),
                        str(nproc): many.get("phases_ms", {}).get("step")},
            "environment": multi.get("environment")}


def markdown(summary: dict) -> str:
    n = str(summary["nproc"])
    rates, steps = summary["samples_per_second"], summary["step_ms"]
    speedup = f"{summary['speedup']:.2f}x" if summary["speedup"] else "-"
    a2a = summary["a2a_ms_per_step"]
    return "\n".join([
        f"# Scaling: {summary['config']} at batch {summary['per_gpu_batch']} per GPU", "",
        "| processes | global samples/s | step ms | a2a ms/step |", "|---|---|---|---|",
        f"| 1 | {rates['1']:,.0f} | {steps['1'] or 0:.2f} | - |",
        f"| {n} | {rates[n]:,.0f} | {steps[n] or 0:.2f} | "
        f"{'-' if a2a is None else f'{a2a:.2f}'} |", "",
        f"Speed-up on {n} processes: {speedup} (target on 2 GPUs: >= 1.8x).", ""])


def main(argv=None) -> int:
    args, passthrough = parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    single = _run(1, args.config, args.out_dir, passthrough)
    multi = _run(args.nproc, args.config, args.out_dir, passthrough)
    summary = summarize(single, multi, args.config, args.nproc)
    smoke = "smoke_" if "--smoke" in passthrough else ""
    base = os.path.join(args.out_dir, f"scaling_{smoke}"
                        f"{'gpu' if bench_train._cuda() else 'cpu'}_x{args.nproc}")
    with open(base + ".json", "w", encoding="utf-8") as f:
        json.dump(summary, f, indent=2, sort_keys=True)
    with open(base + ".md", "w", encoding="utf-8") as f:
        f.write(markdown(summary))
    print(markdown(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
