"""Where the training thread's time goes, function by function, without a profiler.

A training step on one GPU is bound by the host, and a profiler or a stack sampler
slows exactly that host (the profiled step runs at two to three times the
unprofiled one, and a sampler's GIL use inflates the lines that release it). This
runs ``TrainLoop.train_step`` like ``profile_train_step.py`` and wraps a fixed set
of the step's functions with ``time.perf_counter`` (about a microsecond per call),
then reports each one's inclusive milliseconds per step, split by storage where
the function serves one storage (dynamic table or dense rows). Functions of the
autograd backward run on its thread; their times are that thread's. Under
``torchrun --nproc_per_node N`` every rank times its share of the sharded step (the
exchanges, the owners' serving) and writes ``<out>.rankR.*``. ``--ops`` also counts
the operators each function dispatches (host calls, most of them kernel launches;
what a replayed CUDA graph runs is not counted): it shows launch counts on a CPU
too, where the times say little about a GPU's host.

Usage::

    python benchmarks/host_split.py --data DIR --config dynamicemb --out OUT/host_split
    torchrun --nproc_per_node 2 benchmarks/host_split.py --data DIR --out OUT/host_split_x2
"""

from __future__ import annotations

import collections
import contextlib
import functools
import os
import sys
import time

import torch
from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from profile_train_step import _endless, _launcher, _session, finish, step_arguments  # noqa: E402,E501

from hashrec.train.prefetch import DevicePrefetcher  # noqa: E402


def _label_storage(args) -> str:
    storage = args[0]
    return "dynamic" if storage.plan.is_dynamic else "dense"


def _label_rows(args) -> str:
    return "rows" if len(args) > 2 and args[2] else "keys"


def _targets():
    """(owner, attribute, label from the call's arguments or None)."""
    from hashrec.distributed import (
        data_parallel,
        multi_lookup,
        ride,
        sharded_graphs,
        sharded_lookup,
    )
    from hashrec.embedding import batching, collection, dedup_graphs, emit, lookup, sharded
    from hashrec.table import fixed_lookup, hash_table, lookup_graphs, table_refusals
    from hashrec.train import graphs, loop, precision, prefetch

    return [
        (loop.TrainLoop, "train_step", None),
        (prefetch.DevicePrefetcher, "_start", None),
        (prefetch.DevicePrefetcher, "_ready", None),
        (collection.EmbeddingCollection, "prepare", None),
        (collection.EmbeddingCollection, "forward", None),
        (collection.EmbeddingCollection, "_dedup", None),
        (collection.EmbeddingCollection, "_feature_ids", None),
        (collection.EmbeddingCollection, "_count", None),
        (batching, "_sort_storage", _label_rows),
        (batching.PendingDedup, "__init__", None),
        (batching.PendingDedup, "result", None),
        (batching, "_finish_storage", None),
        (collection, "lookup_rows", _label_storage),
        (hash_table.HashTable, "lookup", None),
        (lookup_graphs.LookupGraphs, "_replay", None),
        (lookup_graphs.LookupGraphs, "_check_owner", None),
        (fixed_lookup.FixedSizeLookup, "_add_device_counts", None),
        (table_refusals.TableRefusals, "_report_refused_fixed", None),
        (dedup_graphs.DedupGraphs, "sort", None),
        (torch.cuda.CUDAGraph, "replay", None),
        (collection, "emit_storage", None),
        (collection, "record_lookups", None),
        (emit, "reduce_feature_grads", None),
        (lookup.Storage, "apply_gradients", _label_storage),  # args[0]: the storage
        (graphs.DenseGraphs, "losses_and_logits", None),
        (precision.MixedPrecision, "backward", None),
        (precision.MixedPrecision, "step", None),
        # Several ranks: the sharded lookups, their exchanges and the dense all-reduce.
        (sharded.ShardedLookups, "lookup", None),
        (sharded.ShardedLookups, "backward", None),
        (multi_lookup, "exchange_packed", None),
        (sharded_lookup.ShardedTable, "_serve", None),
        (sharded_lookup.ShardedTable, "_route", None),
        (sharded.ShardedLookups, "_forward", None),
        (ride.Ride, "pack", None),
        (ride.Ride, "unpack", None),
        (ride.RideBuffers, "load", None),
        (sharded, "_apply_dense", None),
        (sharded.ShardedLookups, "_all_reduce_small", None),
        (sharded.ShardedLookups, "_gather_large", None),
        (multi_lookup, "lookup_many", None),
        (multi_lookup, "apply_gradients_many", None),
        (multi_lookup, "all_to_all", None),
        (sharded_lookup.ShardedTable, "_serve_fixed", None),
        (sharded_lookup.ShardedTable, "_answer", None),
        (sharded_lookup.ShardedTable, "_apply_received", None),
        (sharded_lookup, "first_in_runs", None),
        (sharded_lookup, "pack_reply", None),
        (sharded_lookup, "unpack_reply", None),
        (hash_table.HashTable, "apply_gradients", None),
        (data_parallel.FlatGradients, "zero", None),
        (data_parallel.FlatGradients, "all_reduce", None),
        (data_parallel.FlatGradients, "ready", None),
        (data_parallel.FlatGradients, "take_averaged", None),
        # The padded, captured sharded lookup (the default on CUDA).
        (sharded_graphs.ShardedGraphs, "lookup", None),
        (sharded_graphs.ShardedGraphs, "_run", None),
        (sharded_graphs.ShardedGraphs, "apply_gradients", None),
        (sharded_graphs.ShardedGraphs, "_exchange_gradients", None),
        (torch.distributed, "all_to_all_single", None),
        (torch.distributed, "all_reduce", None),
    ]


class _OpCounter(TorchDispatchMode):
    """Counts the operators dispatched while active (each one a host call, most a kernel
    launch on CUDA; what a replayed graph runs is not counted)."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += 1
        return func(*args, **(kwargs or {}))


class _Timers:
    def __init__(self) -> None:
        self.seconds: collections.Counter = collections.Counter()
        self.calls: collections.Counter = collections.Counter()
        self.ops: collections.Counter = collections.Counter()
        self.counter: _OpCounter | None = None  # set: count operators too
        self.on = False
        self._restore = []

    def wrap(self, owner, name: str, label) -> None:
        real = getattr(owner, name)
        static = isinstance(vars(owner).get(name), staticmethod)
        title = f"{getattr(owner, '__name__', owner)}.{name}"

        @functools.wraps(real)
        def timed(*args, **kwargs):
            if not self.on:
                return real(*args, **kwargs)
            start = time.perf_counter()
            ops = self.counter.count if self.counter else 0
            try:
                return real(*args, **kwargs)
            finally:
                key = title if label is None else f"{title}[{label(args)}]"
                self.seconds[key] += time.perf_counter() - start
                self.calls[key] += 1
                if self.counter:
                    self.ops[key] += self.counter.count - ops

        setattr(owner, name, staticmethod(timed) if static else timed)
        self._restore.append((owner, name, staticmethod(real) if static else real))

    def restore(self) -> None:
        for owner, name, real in reversed(self._restore):
            setattr(owner, name, real)


def run(args) -> dict:
    session, loop = _session(args)
    timers = _Timers()
    for owner, name, label in _targets():
        timers.wrap(owner, name, label)
    try:
        prefetcher = DevicePrefetcher(_endless(loop, args.data), session.device,
                                     loop.prepare_ahead)
        it = iter(prefetcher)
        for _ in range(args.warmup):
            loop.train_step(next(it), prefetcher.upcoming)
        sync = torch.cuda.synchronize if session.device.type == "cuda" else (lambda: None)
        sync()
        timers.on = True
        start = time.perf_counter()
        with contextlib.ExitStack() as stack:
            if args.ops:  # slows the step: its times are not the unprofiled ones
                timers.counter = stack.enter_context(_OpCounter())
            for _ in range(args.steps):
                loop.train_step(next(it), prefetcher.upcoming)
            sync()
        wall = (time.perf_counter() - start) * 1000.0 / args.steps
    finally:
        timers.on = False
        timers.restore()
    rows = [{"function": key, "calls_per_step": timers.calls[key] / args.steps,
             "ms_per_step": seconds * 1000.0 / args.steps}
            for key, seconds in timers.seconds.most_common()]
    if args.ops:
        for row in rows:
            row["ops_per_step"] = timers.ops[row["function"]] / args.steps
    return {"config": args.config, "steps": args.steps, "warmup": args.warmup,
            "wall_ms_per_step": wall, "rows": rows,
            "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
            "torch": torch.__version__, "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "command": _launcher() + " ".join(sys.argv)}


def markdown(result: dict) -> str:
    ops = bool(result["rows"]) and "ops_per_step" in result["rows"][0]
    lines = [f"# Host time per function: {result['config']}", "",
             f"{result['date']}, {result['device']}, torch {result['torch']}.", "",
             f"Command: `{result['command']}`", "",
             f"{result['steps']} steps after {result['warmup']} warm-up steps: "
             f"{result['wall_ms_per_step']:.2f} ms/step wall. Inclusive host milliseconds "
             f"per step (nested functions count in their callers too):", "",
             "| function | calls/step | ms/step |" + (" operators/step |" if ops else ""),
             "|---|---:|---:|" + ("---:|" if ops else "")]
    lines += [f"| `{r['function']}` | {r['calls_per_step']:.1f} | {r['ms_per_step']:.3f} |"
              + (f" {r['ops_per_step']:.1f} |" if ops else "") for r in result["rows"]]
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    p = step_arguments(__doc__, warmup=300, steps=200)
    p.add_argument("--ops", action="store_true",
                   help="also count the operators each function dispatches (slower steps)")
    args = p.parse_args(argv)
    result = run(args)
    return finish(result, markdown(result), args.out)


if __name__ == "__main__":
    sys.exit(main())
