"""Host-device synchronizations of MultiTowerDIN training steps, by call site (CUDA only).

Every synchronizing CUDA call (``.item()``, ``.tolist()``, ``nonzero``, boolean
indexing, ...) stalls the host until the device drains its queue, so a step with
many of them is bound by the host. This script builds the example config's
session like ``profile_train_step.py``, runs ``--warmup`` steps, then runs
``--steps`` steps under ``torch.cuda.set_sync_debug_mode("warn")`` and counts
the warnings by the innermost ``hashrec`` frame that triggered them.

Under ``torchrun --nproc_per_node N`` every rank audits its share of the sharded
step and writes ``<out>.rankR.*``.

Usage::

    python benchmarks/audit_syncs.py --data DIR --config dynamicemb --out results/syncs
"""

from __future__ import annotations

import argparse
import collections
import os
import sys
import traceback
import warnings

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from profile_train_step import _launcher, _session, finish, step_arguments  # noqa: E402

from hashrec.train.prefetch import DevicePrefetcher  # noqa: E402


def parse_args(argv=None) -> argparse.Namespace:
    return step_arguments(__doc__, warmup=30, steps=5).parse_args(argv)


def _site() -> str:
    frames = [f for f in traceback.extract_stack()[:-2] if f"{os.sep}hashrec{os.sep}" in
              f.filename]
    if not frames:
        return "(outside hashrec)"
    f = frames[-1]
    return f"{f.filename.split(os.sep + 'hashrec' + os.sep)[-1]}:{f.lineno} {f.name}"


def _take(session, data: str, count: int) -> list:
    """The first ``count`` training batches, over more than one epoch if need be."""
    batches: list = []
    while len(batches) < count:
        before = len(batches)
        for batch in session.loader(data, "train"):
            batches.append(batch)
            if len(batches) == count:
                break
        if len(batches) == before:
            raise SystemExit(f"no training batches in {data}")
    return batches


def run(args) -> dict:
    if not torch.cuda.is_available():
        raise SystemExit("audit_syncs.py needs a CUDA device")
    session, loop = _session(args)
    batches = _take(session, args.data, args.warmup + args.steps)
    # As in the training loop: copied ahead, the next batch's dedup started by the step.
    prefetcher = DevicePrefetcher(batches, session.device, loop.prepare_ahead)
    it = iter(prefetcher)
    for _ in range(args.warmup):
        loop.train_step(next(it), prefetcher.upcoming)
    torch.cuda.synchronize()
    sites: collections.Counter = collections.Counter()
    original = warnings.showwarning

    def record(message, category, *rest, **kwargs):
        if "synchronizing" in str(message):
            sites[_site()] += 1
        else:
            original(message, category, *rest, **kwargs)

    with warnings.catch_warnings():
        warnings.simplefilter("always")
        warnings.showwarning = record
        torch.cuda.set_sync_debug_mode("warn")
        try:
            for _ in range(args.steps):
                loop.train_step(next(it), prefetcher.upcoming)
        finally:
            torch.cuda.set_sync_debug_mode("default")
            warnings.showwarning = original
    rows = [{"site": site, "per_step": count / args.steps} for site, count in
            sites.most_common()]
    return {"config": args.config, "steps": args.steps, "syncs_per_step":
            sum(sites.values()) / args.steps, "sites": rows,
            "device": torch.cuda.get_device_name(0), "torch": torch.__version__,
            "command": _launcher() + " ".join(sys.argv)}


def markdown(r: dict) -> str:
    lines = [f"# Host syncs per training step: {r['config']}", "",
             f"{r['device']}, torch {r['torch']}. Command: `{r['command']}`", "",
             f"{r['syncs_per_step']:.1f} synchronizing calls per step over {r['steps']} steps.",
             "", "| call site | per step |", "|---|---:|"]
    lines += [f"| `{row['site']}` | {row['per_step']:.1f} |" for row in r["sites"]]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    args = parse_args(argv)
    result = run(args)
    return finish(result, markdown(result), args.out)


if __name__ == "__main__":
    sys.exit(main())
