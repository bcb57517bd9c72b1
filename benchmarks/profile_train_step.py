"""Kernel-level profile of MultiTowerDIN training steps (where the step time goes).

Builds the example config's session (``hashrec.train.session.build_session``),
reads batches with the real data loader and runs ``TrainLoop.train_step`` under
``torch.profiler`` for ``--steps`` steps after ``--warmup`` steps (and ``--steps``
unprofiled steps, timed on their own). Prints and writes
the operators and kernels that take the most device time (self time), as a
markdown table with the command, date, device and versions.

Under ``torchrun --nproc_per_node N`` every rank profiles its share of the sharded
step and writes ``<out>.rankR.*``.

Usage::

    python benchmarks/profile_train_step.py --data DIR --out benchmarks/results/profile_train_gpu
    python benchmarks/profile_train_step.py --data DIR --config num_buckets --batch_size 8192
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _host_sampler import HostSampler  # noqa: E402

from hashrec.config import apply_edit_config_json, load_pipeline_config  # noqa: E402
from hashrec.distributed import init_distributed  # noqa: E402
from hashrec.train import checkpoints  # noqa: E402
from hashrec.train.loop import LoopOptions, TrainLoop  # noqa: E402
from hashrec.train.prefetch import DevicePrefetcher, EpochStream  # noqa: E402
from hashrec.train.session import build_session  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIGS = {
    "dynamicemb": os.path.join(ROOT, "examples", "multi_tower_din_taobao_dynamicemb.config"),
    "num_buckets": os.path.join(ROOT, "examples", "multi_tower_din_taobao.config"),
}


def step_arguments(doc: str, warmup: int, steps: int) -> argparse.ArgumentParser:
    """The options of the step benchmarks: data, config, batch size, warm-up and timed
    steps, precision, results path (``doc``: the module docstring)."""
    p = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    p.add_argument("--data", required=True, help="training parquet (files, dirs, globs)")
    p.add_argument("--config", default="dynamicemb", choices=sorted(CONFIGS))
    p.add_argument("--batch_size", type=int, default=8192)
    p.add_argument("--warmup", type=int, default=warmup)
    p.add_argument("--steps", type=int, default=steps)
    p.add_argument("--mixed_precision", default="BF16", choices=("BF16", "FP16", "FP32"))
    p.add_argument("--out", default=None, help="path prefix of the .md and .json results")
    return p


def parse_args(argv=None) -> argparse.Namespace:
    p = step_arguments(__doc__, warmup=15, steps=10)
    p.add_argument("--top", type=int, default=30, help="rows of the table")
    p.add_argument("--sample_steps", type=int, default=0,
                   help="also run this many steps under a sampling profiler of the host's "
                        "Python stacks (where an unprofiled step's host time goes)")
    p.add_argument("--trace", action="store_true",
                   help="also write the profiled steps' timeline as <out>.trace.json.gz")
    return p.parse_args(argv)


def _session(args):
    edits = {"data_config.batch_size": args.batch_size, "data_config.num_workers": 8,
             "train_config.num_steps": args.warmup + 2 * args.steps, "eval_input_path": "",
             "model_dir": "/tmp/hashrec_profile_model"}
    if args.mixed_precision != "FP32":
        edits["train_config.mixed_precision"] = args.mixed_precision
    config = apply_edit_config_json(load_pipeline_config(CONFIGS[args.config]), edits)
    # Under torchrun every rank profiles its own share of a sharded step.
    session = build_session(config, ctx=init_distributed())
    loop = TrainLoop(session, LoopOptions.from_config(config), checkpoints.Resume())
    session.model.train()
    return session, loop


def _endless(loop, data):
    """Batches of ``data``, epoch after epoch, from one loader (as the trainer reads)."""
    stream = EpochStream(lambda first, count: loop.train_stream(data, first, count))
    epoch = 0
    while True:
        yield from stream.epoch(epoch)
        epoch += 1


def run(args) -> dict:
    session, loop = _session(args)
    # Batches reach the step as in the training loop: copied ahead, the next one's
    # id deduplication started by the step.
    prefetcher = DevicePrefetcher(_endless(loop, args.data), session.device,
                                     loop.prepare_ahead)
    it = iter(prefetcher)

    def step():
        loop.train_step(next(it), prefetcher.upcoming)

    for _ in range(args.warmup):
        step()
    cuda = session.device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    sync()
    start = time.perf_counter()
    for _ in range(args.steps):
        step()
    sync()
    plain = (time.perf_counter() - start) / args.steps
    sampled = None
    if args.sample_steps:
        with HostSampler() as sampler:
            start = time.perf_counter()
            for _ in range(args.sample_steps):
                step()
            sync()
            seconds = time.perf_counter() - start
        sampled = sampler.report(seconds, args.sample_steps)
        sampled["ms_per_step"] = seconds * 1000.0 / args.sample_steps
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    start = time.perf_counter()
    with profile(activities=activities) as prof:
        for _ in range(args.steps):
            step()
        sync()
    wall = (time.perf_counter() - start) / args.steps
    key = "self_device_time_total" if cuda else "self_cpu_time_total"
    events = sorted(prof.key_averages(), key=lambda e: getattr(e, key, 0), reverse=True)
    rows = [{"name": e.key[:90], "calls": e.count,
             "ms_per_step": getattr(e, key, 0) / 1000.0 / args.steps} for e in events[:args.top]]
    total = sum(getattr(e, key, 0) for e in events) / 1000.0 / args.steps
    result = {"config": args.config, "batch_size": args.batch_size, "steps": args.steps,
              "wall_ms_per_step_unprofiled": plain * 1000.0,
              "wall_ms_per_step": wall * 1000.0, "profiled_ms_per_step": total,
              "time_kind": "device self time" if cuda else "CPU self time", "top": rows,
              "device": torch.cuda.get_device_name(0) if cuda else "cpu",
              "torch": torch.__version__, "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
              "command": _launcher() + " ".join(sys.argv)}
    result["host_regions"] = _host_regions(prof, args.steps)
    if sampled is not None:
        result["host_samples"] = sampled
    if cuda:
        result.update(_kernel_summary(prof, args.steps))
    trace = rank_prefix(args.out)
    if args.trace and trace:
        prof.export_chrome_trace(trace + ".trace.json")
        with open(trace + ".trace.json", "rb") as f, gzip.open(trace + ".trace.json.gz", "wb") as g:
            g.write(f.read())
        os.remove(trace + ".trace.json")
    return result


# Operators and autograd nodes that mark the regions of a training step on the host.
HOST_REGIONS = ("_StorageLookup", "_LookupAll", "_EmitStorage", "Graphed", "aten::sort",
                "Optimizer.step", "enumerate(DataLoader)",
                "autograd::engine::evaluate_function: _EmitStorageBackward",
                "autograd::engine::evaluate_function: _StorageLookupBackward",
                "autograd::engine::evaluate_function: _LookupAllBackward",
                "autograd::engine::evaluate_function: GraphedBackward")


def _launcher() -> str:
    """How this run was started, for the record: plain python or torchrun."""
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    return f"torchrun --nproc_per_node {world} " if world > 1 else "python "


def _host_regions(prof, steps: int) -> list[dict]:
    """Host time (inclusive, profiled) per step of the step's marked regions: where a
    host-bound step spends its time (the dedup's sorts, the lookups, the emits, ...)."""
    rows = [{"name": e.key[:90], "calls": e.count,
             "host_ms_per_step": e.cpu_time_total / 1000.0 / steps}
            for e in prof.key_averages() if e.key.startswith(HOST_REGIONS)]
    return sorted(rows, key=lambda row: row["host_ms_per_step"], reverse=True)


def _kernel_summary(prof, steps: int) -> dict:
    """Kernel launches per step and the device's busy time per step (the union of the
    kernels' and copies' intervals on the timeline)."""
    spans = sorted((e.time_range.start, e.time_range.end) for e in prof.events()
                   if e.device_type == DeviceType.CUDA)
    busy, end = 0.0, -1.0
    for s, e in spans:
        if e <= end:
            continue
        busy += e - max(s, end)
        end = e
    return {"kernels_per_step": len(spans) / steps, "device_busy_ms_per_step": busy / 1000 / steps}


def markdown(r: dict) -> str:
    lines = [f"# Training-step profile: {r['config']} (batch {r['batch_size']})", "",
             f"{r['date']}, {r['device']}, torch {r['torch']}.", "",
             f"Command: `{r['command']}`", "",
             f"{r['steps']} steps without the profiler: "
             f"{r['wall_ms_per_step_unprofiled']:.2f} ms/step wall.", "",
             f"{r['steps']} profiled steps: {r['wall_ms_per_step']:.2f} ms/step wall; "
             f"{r['time_kind']} summed over operators and kernels "
             f"{r['profiled_ms_per_step']:.2f} ms/step"
             + (f"; {r['kernels_per_step']:.0f} device activities (kernels, copies, "
                f"memsets) per step, device busy {r['device_busy_ms_per_step']:.2f} ms/step."
                if "kernels_per_step" in r else "."), "",
             "| operator / kernel | calls | ms/step |", "|---|---:|---:|"]
    lines += [f"| `{row['name']}` | {row['calls']} | {row['ms_per_step']:.3f} |"
              for row in r["top"]]
    if r.get("host_regions"):
        lines += ["", "Host time of the step's regions (profiled, inclusive; the profiler "
                  "slows the host, so compare regions, not totals):", "",
                  "| region | calls | host ms/step |", "|---|---:|---:|"]
        lines += [f"| `{row['name']}` | {row['calls']} | {row['host_ms_per_step']:.3f} |"
                  for row in r["host_regions"]]
    if r.get("host_samples"):
        h = r["host_samples"]
        lines += ["", f"Sampled host stacks ({h['rounds']} rounds over steps at "
                  f"{h['ms_per_step']:.2f} ms/step; ms/step a thread spent at a line or "
                  f"inside a function of the project, calls it made included):", ""]
        for kind in ("self", "inclusive", "outside"):
            lines += [f"| {kind} | ms/step |", "|---|---:|"]
            lines += [f"| `{row['where']}` | {row['ms_per_step']:.3f} |" for row in h[kind]]
            lines.append("")
    return "\n".join(lines) + "\n"


def rank_prefix(prefix: str | None) -> str | None:
    """``prefix`` in one process; ``<prefix>.rankN`` for rank N under torchrun."""
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    if prefix is None or world == 1:
        return prefix
    return f"{prefix}.rank{os.environ.get('RANK', '0')}"


def report(result: dict, text: str, prefix: str | None) -> None:
    """Prints the markdown and writes ``<prefix>.json`` and ``<prefix>.md`` when given
    (``<prefix>.rankN.*`` for rank N under torchrun)."""
    print(text)
    prefix = rank_prefix(prefix)
    if prefix:
        with open(prefix + ".json", "w", encoding="utf-8") as f:
            json.dump(result, f, indent=1)
        with open(prefix + ".md", "w", encoding="utf-8") as f:
            f.write(text)


def finish(result: dict, text: str, prefix: str | None) -> int:
    """``report`` the result, then leave the process group (under torchrun); exit code 0."""
    report(result, text, prefix)
    if torch.distributed.is_initialized():
        from hashrec.distributed.sharded_graphs import release_graphs

        release_graphs()  # captured exchanges hold the group's collectives
        torch.distributed.destroy_process_group()
    return 0


def main(argv=None) -> int:
    args = parse_args(argv)
    result = run(args)
    return finish(result, markdown(result), args.out)


if __name__ == "__main__":
    sys.exit(main())
