"""Operators one embedding forward dispatches (a host-cost proxy that needs no GPU).

A small-batch training step is host-bound: its time follows the operators and
kernels it launches. This builds an example config's session on the CPU, runs
``--warmup`` embedding forwards in train mode on real batches, then counts the
ATen operators the next forward dispatches (a ``TorchDispatchMode``), by name.
The CPU path runs reference ops where the GPU runs Triton kernels, so compare
counts of one config across commits, not with a GPU profile.

Usage::

    python benchmarks/count_forward_ops.py --data DIR --config dynamicemb
"""

from __future__ import annotations

import argparse
import collections
import os
import sys

from torch.utils._python_dispatch import TorchDispatchMode

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from profile_train_step import CONFIGS  # noqa: E402

from hashrec.config import apply_edit_config_json, load_pipeline_config  # noqa: E402
from hashrec.train.session import build_session  # noqa: E402


class _Count(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.ops: collections.Counter = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops[str(func.overloadpacket)] += 1
        return func(*args, **(kwargs or {}))


def count(data: str, config: str, batch_size: int, warmup: int) -> collections.Counter:
    edits = {"data_config.num_workers": 0, "data_config.batch_size": batch_size,
             "model_dir": "/tmp/hashrec_count_ops_model", "eval_input_path": ""}
    session = build_session(apply_edit_config_json(load_pipeline_config(CONFIGS[config]), edits))
    session.model.train()
    batches = iter(session.loader(data, "train"))
    embedding = session.model.embedding
    for _ in range(warmup):
        embedding(next(batches).sparse)
    batch = next(batches)
    with _Count() as counter:
        embedding(batch.sparse)
    return counter.ops


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="training parquet (files, dirs, globs)")
    p.add_argument("--config", default="dynamicemb", choices=sorted(CONFIGS))
    p.add_argument("--batch_size", type=int, default=512)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--top", type=int, default=15)
    args = p.parse_args(argv)
    ops = count(args.data, args.config, args.batch_size, args.warmup)
    print(f"{args.config}: {sum(ops.values())} operators in one embedding forward "
          f"(batch {args.batch_size}, CPU)")
    for name, n in ops.most_common(args.top):
        print(f"  {n:5d} {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
