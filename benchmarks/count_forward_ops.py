"""Operators one embedding step dispatches (a host-cost proxy that needs no GPU).

A small-batch training step is host-bound: its time follows the operators and
kernels it launches. This builds an example config's session on the CPU, runs
``--warmup`` embedding forwards in train mode on real batches, then counts the
ATen operators the next forward dispatches (a ``TorchDispatchMode``), by name.

By default the CPU path runs reference ops where the GPU runs Triton kernels, so
compare counts of one config across commits, not with a GPU profile. ``--triton``
takes the GPU's code path instead (``HASHREC_FORCE_TRITON=1`` with the kernels in
Triton's interpreter): each kernel launch counts once, as ``triton <kernel>``,
and the operators the interpreter runs inside it are not counted. ``--backward``
also counts the backward of the sum of the outputs (the storages' gradient
reduction and fused optimizer); the few operators of that sum are counted too.

Usage::

    python benchmarks/count_forward_ops.py --data DIR --config dynamicemb
    python benchmarks/count_forward_ops.py --data DIR --config dynamicemb --triton --backward
"""

from __future__ import annotations

import argparse
import collections
import os
import sys

if "--triton" in sys.argv:  # before any kernel module is imported
    os.environ["HASHREC_FORCE_TRITON"] = "1"
    os.environ["TRITON_INTERPRET"] = "1"

from torch.utils._python_dispatch import TorchDispatchMode  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from profile_train_step import CONFIGS  # noqa: E402

from hashrec.config import apply_edit_config_json, load_pipeline_config  # noqa: E402
from hashrec.train.session import build_session  # noqa: E402


class _Count(TorchDispatchMode):
    def __init__(self, by_caller: bool = False) -> None:
        super().__init__()
        self.ops: collections.Counter = collections.Counter()
        self.callers: collections.Counter = collections.Counter()
        self.by_caller = by_caller
        self.paused = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if not self.paused:
            self.ops[str(func.overloadpacket)] += 1
            if self.by_caller:
                self.callers[_caller()] += 1
        return func(*args, **(kwargs or {}))


def _caller() -> str:
    """The innermost frame of the project's code on the stack, as ``path:function``."""
    frame = sys._getframe(2)
    while frame is not None:
        path = frame.f_code.co_filename.replace(os.sep, "/")
        if "/hashrec/" in path:
            return f"{path[path.rindex('/hashrec/') + 1:]}:{frame.f_code.co_name}"
        frame = frame.f_back
    return "(outside the project)"


def _count_launches(counter: _Count):
    """Counts each Triton launch once and pauses the count inside it (the interpreter's
    own operators are not the step's)."""
    from hashrec.table.ops.launch import FastKernel

    launch = FastKernel.launch

    def counted(self, grid, args, kwargs):
        counter.ops["triton " + self.kernel.fn.__name__] += 1
        if counter.by_caller:
            counter.callers[_caller()] += 1
        counter.paused = True
        try:
            return launch(self, grid, args, kwargs)
        finally:
            counter.paused = False

    FastKernel.launch = counted
    return lambda: setattr(FastKernel, "launch", launch)


def _outputs_sum(out):
    return sum(v.float().sum() for v in out.pooled.values()) + \
        sum(v.float().sum() for v, _ in out.sequences.values())


def count(data: str, config: str, batch_size: int, warmup: int, triton: bool = False,
          backward: bool = False, by_caller: bool = False) -> _Count:
    edits = {"data_config.num_workers": 0, "data_config.batch_size": batch_size,
             "model_dir": "/tmp/hashrec_count_ops_model", "eval_input_path": ""}
    session = build_session(apply_edit_config_json(load_pipeline_config(CONFIGS[config]), edits))
    session.model.train()
    batches = iter(session.loader(data, "train"))
    embedding = session.model.embedding

    def step():
        out = embedding(next(batches).sparse)
        if backward:
            _outputs_sum(out).backward()

    for _ in range(warmup):
        step()
    counter = _Count(by_caller)
    restore = _count_launches(counter) if triton else (lambda: None)
    try:
        with counter:
            step()
    finally:
        restore()
    return counter


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", required=True, help="training parquet (files, dirs, globs)")
    p.add_argument("--config", default="dynamicemb", choices=sorted(CONFIGS))
    p.add_argument("--batch_size", type=int, default=512)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--top", type=int, default=15)
    p.add_argument("--triton", action="store_true",
                   help="the GPU's code path, kernels interpreted (see the module docstring)")
    p.add_argument("--backward", action="store_true", help="count the backward too")
    p.add_argument("--by_caller", action="store_true",
                   help="also count by the innermost function of the project that called")
    args = p.parse_args(argv)
    counter = count(args.data, args.config, args.batch_size, args.warmup, args.triton,
                    args.backward, args.by_caller)
    ops = counter.ops
    launches = sum(n for name, n in ops.items() if name.startswith("triton "))
    what = "forward and backward" if args.backward else "forward"
    path = "Triton path, interpreted" if args.triton else "CPU"
    print(f"{args.config}: {sum(ops.values()) - launches} operators and {launches} Triton "
          f"launches in one embedding {what} (batch {args.batch_size}, {path})")
    for name, n in ops.most_common(args.top):
        print(f"  {n:5d} {name}")
    if args.by_caller:
        print("by caller (operators and launches):")
        for name, n in counter.callers.most_common(args.top):
            print(f"  {n:5d} {name}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
