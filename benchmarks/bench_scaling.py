"""Data-parallel scaling of training: the same config on 1 and on N GPUs in one call.

Runs ``bench_train`` (the real trainer under torchrun, step timing on) for the
dynamicemb example config at ``--batch_size`` per GPU, on one process and on
``--nproc`` processes, ``--rounds`` times interleaved (1, N, 1, N, ...: a host's
drift touches both alike), and reports global samples/s of each run, the speed-up
of every round and of the medians (target on 2 GPUs: >= 1.8x) and the all-to-all
time per step of the sharded embedding exchanges (from the trainer's progress log,
``a2a ... ms/step``). Writes ``scaling_<device>_x<N>.json`` and ``.md`` to
``--out_dir`` after every round, so a run cut short keeps the rounds it finished.

Usage::

    python benchmarks/bench_scaling.py --nproc 2 --rounds 3 --out_dir benchmarks/results
    python benchmarks/bench_scaling.py --nproc 2 --smoke     # tiny CPU run (gloo)

Other options go to ``bench_train`` (``--data_dir``, ``--num_rows``, ``--num_steps``,
``--warmup_steps``, ...).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys

import bench_train


def parse_args(argv=None) -> tuple[argparse.Namespace, list[str]]:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--nproc", type=int, default=2, help="GPUs of the multi-process run")
    p.add_argument("--config", default="dynamicemb", choices=sorted(bench_train.CONFIGS))
    p.add_argument("--rounds", type=int, default=1, help="1-process and N-process runs, "
                                                         "interleaved")
    p.add_argument("--out_dir", default=os.path.join(bench_train.ROOT, "benchmarks", "results"))
    args, passthrough = p.parse_known_args(argv)
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    return args, passthrough


def _run(nproc: int, config: str, out_dir: str, passthrough: list[str]) -> dict:
    """One bench_train call; returns its run of ``config`` (its report under ``out_dir``)."""
    argv = ["--nproc", str(nproc), "--configs", config, "--out_dir", out_dir, *passthrough]
    if bench_train.main(argv):
        raise RuntimeError(f"bench_train failed for --nproc {nproc}")
    smoke = "smoke_" if "--smoke" in passthrough else ""
    device = "gpu" if bench_train._cuda() else "cpu"
    name = f"train_{smoke}{device}" + (f"_x{nproc}" if nproc > 1 else "")
    with open(os.path.join(out_dir, name + ".json"), encoding="utf-8") as f:
        report = json.load(f)
    return {**report["runs"][config], "environment": report.get("environment")}


def _rate(run: dict) -> float:
    return run.get("global_samples_per_second") or 0.0


def summarize(singles: list[dict], multis: list[dict], config: str, nproc: int,
              command: str) -> dict:
    """Rounds of a 1-process and an ``nproc``-process run of ``config``."""
    rounds = [{"samples_per_second": {"1": _rate(one), str(nproc): _rate(many)},
               "speedup": _rate(many) / _rate(one) if _rate(one) else None,
               "step_ms": {"1": one.get("phases_ms", {}).get("step"),
                           str(nproc): many.get("phases_ms", {}).get("step")},
               "a2a_ms_per_step": many.get("a2a_ms_per_step")}
              for one, many in zip(singles, multis)]
    median1 = statistics.median(_rate(r) for r in singles)
    median_n = statistics.median(_rate(r) for r in multis)
    return {"config": config, "nproc": nproc, "command": command,
            "per_gpu_batch": multis[0].get("per_gpu_batch"), "rounds": rounds,
            "median_samples_per_second": {"1": median1, str(nproc): median_n},
            "speedup": median_n / median1 if median1 else None,
            "environment": multis[0].get("environment")}


def _ms(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def markdown(summary: dict) -> str:
    n, env = str(summary["nproc"]), summary.get("environment") or {}
    medians = summary["median_samples_per_second"]
    speedup = f"{summary['speedup']:.2f}x" if summary["speedup"] else "-"
    lines = [f"# Scaling: {summary['config']} at batch {summary['per_gpu_batch']} per GPU", "",
             f"{env.get('date', '')}, GPU {env.get('gpu', '-')}, {env.get('cpus', '-')} CPUs, "
             f"torch {env.get('torch', '-')}, triton {env.get('triton', '-')}.", "",
             f"Command: `{summary['command']}`", "",
             f"| round | 1 process samples/s | {n} processes samples/s | speed-up | "
             f"step ms (1 / {n}) | a2a ms/step |", "|---:|---:|---:|---:|---:|---:|"]
    for i, r in enumerate(summary["rounds"], 1):
        rates, steps = r["samples_per_second"], r["step_ms"]
        ratio = "-" if not r["speedup"] else f"{r['speedup']:.2f}x"
        lines.append(f"| {i} | {rates['1']:,.0f} | {rates[n]:,.0f} | {ratio} | "
                     f"{_ms(steps['1'])} / {_ms(steps[n])} | {_ms(r['a2a_ms_per_step'])} |")
    lines += ["", f"Medians: {medians['1']:,.0f} samples/s on 1 process, {medians[n]:,.0f} on "
                  f"{n}; speed-up of the medians on {n} processes: {speedup} (target on 2 "
                  f"GPUs: >= 1.8x). Runs were interleaved, 1 then {n} in every round.", ""]
    return "\n".join(lines)


def main(argv=None) -> int:
    args, passthrough = parse_args(argv)
    os.makedirs(args.out_dir, exist_ok=True)
    command = "python " + " ".join([os.path.relpath(__file__, bench_train.ROOT),
                                    *(sys.argv[1:] if argv is None else argv)])
    smoke = "smoke_" if "--smoke" in passthrough else ""
    base = os.path.join(args.out_dir, f"scaling_{smoke}"
                        f"{'gpu' if bench_train._cuda() else 'cpu'}_x{args.nproc}")
    singles, multis = [], []
    for _ in range(args.rounds):
        singles.append(_run(1, args.config, args.out_dir, passthrough))
        multis.append(_run(args.nproc, args.config, args.out_dir, passthrough))
        summary = summarize(singles, multis, args.config, args.nproc, command)
        with open(base + ".json", "w", encoding="utf-8") as f:
            json.dump(summary, f, indent=2, sort_keys=True)
        with open(base + ".md", "w", encoding="utf-8") as f:
            f.write(markdown(summary))
    print(markdown(summary), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
