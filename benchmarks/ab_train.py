"""Two source trees timed against each other on one host: an A/B of ``bench_train``.

GPU hosts of one kind differ by tens of percent in training throughput (the step
is host-bound), so a change is judged only against its baseline measured in the
same call. This runs ``bench_train.py`` of every tree in turn, ``--rounds``
times (A, B, A, B, ...: a drift of the host hits both), each tree's trainer
importing its own ``hashrec``, on the same generated data, and reports every
tree's median samples/s per config and the ratio of each tree to the first.

A tree is a directory holding a ``hashrec`` package, ``examples/`` and
``benchmarks/``: the working tree itself (``.``) or an exported revision
(``benchmarks/ab_tree.sh REV`` writes ``.ab/<REV>``). A tree may carry environment
variables for its runs after ``+`` signs (``.+HASHREC_LOOKUP_GRAPHS=0``), so one
tree can run against itself with a setting changed.

Usage::

    python benchmarks/ab_train.py --trees .ab/9e8499e,. --configs dynamicemb \\
        --data_dir DATA --num_steps 700 --warmup_steps 400 --out benchmarks/results/ab_gpu
    python benchmarks/ab_train.py --trees .+HASHREC_SWITCH_INTERVAL_MS=5,. \\
        --configs dynamicemb --data_dir DATA --out benchmarks/results/ab_gpu_switch
    python benchmarks/ab_train.py --trees .,.+HASHREC_LOOKUP_GRAPHS=0 --smoke  # tiny CPU run
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _timing import write_results  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PHASES = ("data_wait", "embedding_forward", "dense_forward", "dense_backward",
          "embedding_backward", "optimizer", "step")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--trees", required=True,
                   help="comma-separated source trees, each optionally followed by "
                        "+NAME=VALUE environment settings; the first is the baseline")
    p.add_argument("--configs", default="dynamicemb,num_buckets")
    p.add_argument("--rounds", type=int, default=2, help="runs of every tree, interleaved")
    p.add_argument("--data_dir", default=None, help="generated data (made when missing)")
    p.add_argument("--num_rows", type=int, default=1_000_000)
    p.add_argument("--num_steps", type=int, default=700)
    p.add_argument("--warmup_steps", type=int, default=400)
    p.add_argument("--nproc", type=int, default=1)
    p.add_argument("--smoke", action="store_true", help="tiny CPU runs (bench_train --smoke)")
    p.add_argument("--out", default=None, help="path prefix of the .json and .md results")
    args = p.parse_args(argv)
    args.trees = [t.strip() for t in args.trees.split(",") if t.strip()]
    if len(set(args.trees)) != len(args.trees):
        p.error("--trees: each entry (tree and settings) must differ from the others")
    for entry in args.trees:
        tree, settings = split_tree(entry)
        for part in ("hashrec", "examples", os.path.join("benchmarks", "bench_train.py")):
            if not os.path.exists(os.path.join(tree, part)):
                p.error(f"--trees: {tree!r} has no {part}")
        for setting in settings:
            if "=" not in setting or not setting.split("=", 1)[0]:
                p.error(f"--trees: {entry!r}: settings are +NAME=VALUE, got {setting!r}")
    if args.rounds < 1:
        p.error("--rounds must be >= 1")
    return args


def split_tree(entry: str) -> tuple[str, list[str]]:
    """``TREE+NAME=VALUE+...`` -> (TREE, ["NAME=VALUE", ...])."""
    tree, *settings = entry.split("+")
    return tree, settings


def run_tree(entry: str, args, data: str, out_dir: str) -> dict:
    """One ``bench_train`` run of a ``--trees`` entry; returns its JSON report."""
    tree, settings = split_tree(entry)
    tree = os.path.abspath(tree)
    cmd = [sys.executable, os.path.join(tree, "benchmarks", "bench_train.py"),
           "--data_dir", data, "--num_rows", str(args.num_rows), "--configs", args.configs,
           "--nproc", str(args.nproc), "--out_dir", out_dir]
    if args.smoke:
        cmd.append("--smoke")
    else:
        cmd += ["--num_steps", str(args.num_steps), "--warmup_steps", str(args.warmup_steps)]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [tree] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                  if p and os.path.abspath(p) != ROOT])}
    env.update(setting.split("=", 1) for setting in settings)
    print(f"[ab_train {time.strftime('%H:%M:%S')}] {entry}: {' '.join(settings + cmd)}",
          flush=True)
    subprocess.run(cmd, cwd=tree, env=env, check=True)
    reports = [f for f in os.listdir(out_dir) if f.startswith("train_") and f.endswith(".json")]
    if len(reports) != 1:
        raise RuntimeError(f"{tree}: expected one bench_train report in {out_dir}, "
                           f"found {reports}")
    with open(os.path.join(out_dir, reports[0]), encoding="utf-8") as f:
        return json.load(f)


def summarize(trees: list[str], reports: dict[str, list[dict]]) -> dict:
    """Per tree and config: every run's samples/s, the median, the ratio to tree 0, and
    each step phase's median milliseconds."""
    configs = sorted({c for runs in reports.values() for r in runs for c in r["runs"]})
    out = {}
    for tree in trees:
        out[tree] = {}
        for config in configs:
            runs = [r["runs"][config] for r in reports[tree] if config in r["runs"]]
            rates = [run["global_samples_per_second"] for run in runs]
            phases = {name: statistics.median(run.get("phases_ms", {}).get(name, 0.0)
                                              for run in runs)
                      for name in PHASES if any(name in run.get("phases_ms", {})
                                                for run in runs)}
            threads = [run.get("host_threads", {}) for run in runs]
            out[tree][config] = {"runs": rates, "median": statistics.median(rates),
                                 "phases_ms": phases, "ranks_ms": [_rank_phases(run)
                                                                   for run in runs],
                                 "main_thread_cpu_share": [t.get("main_thread_cpu_share")
                                                           for t in threads],
                                 "preemptions_per_step": [t.get("preemptions_per_step")
                                                          for t in threads]}
    for tree in trees:
        for config in configs:
            base = out[trees[0]][config]["median"]
            out[tree][config]["ratio_to_first"] = out[tree][config]["median"] / base
    return out


RANK_PHASES = ("embedding_forward", "embedding_backward")


def _rank_phases(run: dict) -> list[dict]:
    """Each rank's embedding phases (ms/step) of a run under several ranks, else []:
    they hold the exchanges, so the rank that waits for its peers shows there."""
    return [{name: r.get("phases_ms", {}).get(name) for name in RANK_PHASES}
            for r in run.get("ranks") or []]


def _rank_lines(result: dict) -> list[str]:
    rows = [(tree, config, r["ranks_ms"]) for tree, configs in result["trees"].items()
            for config, r in configs.items() if any(r.get("ranks_ms") or [])]
    if not rows:
        return []
    lines = ["", "Embedding forward / backward ms per step of each rank (rank 0, rank 1, "
                 "...), run by run:", "", "| tree | config | runs |", "|---|---|---|"]
    for tree, config, runs in rows:
        text = "; ".join(", ".join(f"{_ms(r['embedding_forward'])} / "
                                   f"{_ms(r['embedding_backward'])}" for r in ranks) or "-"
                         for ranks in runs)
        lines.append(f"| `{tree}` | {config} | {text} |")
    return lines


def _ms(value) -> str:
    return "-" if value is None else f"{value:.2f}"


def markdown(result: dict) -> str:
    lines = ["# A/B training throughput (bench_train, one host)", "",
             f"{result['date']}; {result['environment']}.", "",
             f"Command: `{result['command']}`", "",
             f"Every tree ran {result['rounds']} time(s), interleaved; samples/s are global, "
             f"averaged over each run's steps after warm-up.", "",
             "| tree | config | runs (samples/s) | median | vs first tree |",
             "|---|---|---|---:|---:|"]
    for tree, configs in result["trees"].items():
        for config, r in configs.items():
            runs = ", ".join(f"{x:,.0f}" for x in r["runs"])
            lines.append(f"| `{tree}` | {config} | {runs} | {r['median']:,.0f} | "
                         f"{r['ratio_to_first']:.3f} |")
    lines += ["", "Median milliseconds per step of each phase (bench_train's step timing: "
              "device timeline, or host clock for runs with HASHREC_STEP_TIMING=host):", "",
              "| tree | config | " + " | ".join(PHASES) + " |",
              "|---|---|" + "---:|" * len(PHASES)]
    for tree, configs in result["trees"].items():
        for config, r in configs.items():
            cells = " | ".join(f"{r.get('phases_ms', {}).get(p, 0.0):.2f}" for p in PHASES)
            lines.append(f"| `{tree}` | {config} | {cells} |")
    lines += ["", "Training threads of rank 0 in each run, in run order (main thread's CPU "
              "time as a share of the wall clock; preemptions of the main and autograd "
              "threads per step; - where not recorded):", "",
              "| tree | config | main thread on the CPU | preemptions/step |", "|---|---|---|---|"]
    for tree, configs in result["trees"].items():
        for config, r in configs.items():
            share = ", ".join("-" if x is None else f"{100 * x:.0f}%"
                              for x in r.get("main_thread_cpu_share", []))
            preempted = ", ".join("-" if x is None else f"{x:.1f}"
                                  for x in r.get("preemptions_per_step", []))
            lines.append(f"| `{tree}` | {config} | {share} | {preempted} |")
    lines += _rank_lines(result)
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    data = args.data_dir or os.path.join(tempfile.gettempdir(), "hashrec_ab_data")
    reports: dict[str, list[dict]] = {t: [] for t in args.trees}
    environment = None
    command = "python " + " ".join([os.path.relpath(__file__, ROOT),
                                    *(sys.argv[1:] if argv is None else argv)])
    with tempfile.TemporaryDirectory(prefix="ab_train_") as scratch:
        for round_ in range(args.rounds):
            for i, tree in enumerate(args.trees):
                out_dir = os.path.join(scratch, f"tree{i}_round{round_}")
                report = run_tree(tree, args, data, out_dir)
                reports[tree].append(report)
                environment = environment or report.get("environment")
            # Every finished round is written: a run cut short keeps the rounds before it.
            text = _report(args, reports, round_ + 1, environment or {}, command)
    print(text, flush=True)
    return 0


def _report(args, reports: dict, rounds: int, env: dict, command: str) -> str:
    """The A/B's markdown after ``rounds`` rounds, written to ``args.out`` when set."""
    result = {"trees": summarize(args.trees, reports), "rounds": rounds,
              "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "environment": ", ".join(f"{k} {v}" for k, v in sorted(env.items())
                                       if k != "date"),
              "command": command}
    text = markdown(result)
    if args.out:
        os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
        write_results(args.out, result, text)
    return text


if __name__ == "__main__":
    sys.exit(main())
