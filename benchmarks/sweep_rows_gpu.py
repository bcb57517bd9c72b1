"""Launch configurations of the embedding layer's row kernels, in its published setup.

The layer's forward moves each unique id's row twice: the training lookup's finish
kernel (``finish_rows``) reads it from the table into the (U, dim) unique rows, and
the pooling kernel (``pool_rows``) gathers those rows into the (B, dim) output. This
script times both kernels alone on the setup of ``bench_embedding_layer.py`` (10
tables as tags of one storage, dim 128, 1,048,570 power-law ids a step, every key
stored), under each launch configuration asked for, the default first:

* ``--finish-configs ELEMENTSxWARPS ...``: keys x columns a program, and warps;
* ``--pool-configs ROWSxWARPS ...``: bags a program, and warps. Pooling is timed from
  the unique rows (as the layer pools) and straight from table rows by slot, over bags
  of ``--bag-length`` ids (1 in the setup).

* ``--gather-configs ROWSxWARPS ...``: output rows a program, and warps, of the
  padded sequence gather (``gather_padded``) from the unique rows, each bag a sequence
  of ``--bag-length``;
* ``--apply-configs ROWSxWARPS ...``: rows a program, and warps, of the sparse
  optimizer's update of the unique rows (``apply_sparse_update``), as the layer's
  backward runs it after the gradient reduction.

The backward's gradient reduction is timed too, at its default tiles: alone
(``reduce_rows``, writing the (U, dim) sums the update then reads) and fused with the
update (``reduce_and_apply``), each reading every position's gradient row through
``order`` (``*_by_position``) or from rows given in sorted order (``*_sorted``), the
output gradients those of the step's (B, dim) pooled outputs.

``--optimizer`` (sgd, adagrad, rowwise_adagrad, adam) sets the rows' state columns.

    python benchmarks/sweep_rows_gpu.py --out benchmarks/results/sweep_rows_gpu
    python benchmarks/sweep_rows_gpu.py --smoke
"""

from __future__ import annotations

import argparse
import functools
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from _cli import add_out_and_smoke, parse_with_smoke  # noqa: E402

OPTIMIZERS = {"sgd": "SparseSGD", "adagrad": "SparseAdagrad",
              "rowwise_adagrad": "SparseRowWiseAdagrad", "adam": "SparseAdam"}


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tables", type=int, default=10)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--optimizer", choices=sorted(OPTIMIZERS), default="sgd")
    p.add_argument("--ids", type=int, default=1_048_570)
    p.add_argument("--capacity", type=int, default=1_677_721)
    p.add_argument("--key-range", type=int, default=1_000_000)
    p.add_argument("--alpha", type=float, default=1.05)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--finish-configs", nargs="*", default=[])
    p.add_argument("--pool-configs", nargs="*", default=[])
    p.add_argument("--apply-configs", nargs="*", default=[])
    p.add_argument("--gather-configs", nargs="*", default=[])
    p.add_argument("--bag-length", type=int, default=1,
                   help="ids a pooled bag (the setup has one id a sample per table)")
    add_out_and_smoke(p)
    args = parse_with_smoke(p)
    if args.smoke:
        args.tables, args.dim, args.ids, args.capacity, args.key_range, args.steps = (
            2, 8, 60, 512, 100, 2)
    return args


ARGS = _args()

import torch  # noqa: E402
from _timing import command_line, environment, time_device_ms, write_results  # noqa: E402

from hashrec.embedding.ops.fused import dedup  # noqa: E402
from hashrec.embedding.ops.fused import triton as fused_tt  # noqa: E402
from hashrec.embedding.ops.sequence import triton as sequence_tt  # noqa: E402
from hashrec.table import InitializerArgs, optim  # noqa: E402
from hashrec.table.ops.find.triton import find_slots  # noqa: E402
from hashrec.table.ops.insert import finish  # noqa: E402
from hashrec.table.ops.insert.triton import insert_keys  # noqa: E402
from hashrec.table.ops.optimizer import triton as optimizer_tt  # noqa: E402
from hashrec.table.storage import TableStorage  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TAG_SHIFT = 40


def _pair_batches() -> list[torch.Tensor]:
    """Per step (tables * ids // tables,) int64 (table << 40 | key) pairs, power law."""
    ranks = torch.arange(1, ARGS.key_range + 1, device=DEVICE, dtype=torch.float64)
    probs = (ranks ** -ARGS.alpha).float()
    per_table = ARGS.ids // ARGS.tables
    perm = torch.randperm(ARGS.key_range, device=DEVICE)
    tags = torch.arange(ARGS.tables, device=DEVICE)[:, None]
    return [((tags << TAG_SHIFT) | perm[torch.multinomial(probs, per_table * ARGS.tables,
                                                          replacement=True)]
             .view(ARGS.tables, per_table)).flatten() for _ in range(ARGS.steps)]


class Step:
    """One batch, deduplicated, every key stored: what the two kernels read."""

    def __init__(self, storage: TableStorage, pairs: torch.Tensor) -> None:
        d = dedup(pairs)
        self.inverse, self.order, self.row_start = d.inverse, d.order, d.row_start
        self.sorted_rows = d.inverse[d.order]
        self.keys = d.unique & ((1 << TAG_SHIFT) - 1)
        self.tags = (d.unique >> TAG_SHIFT).to(torch.int32)
        self.slots = find_slots(storage, self.keys, self.tags)
        miss = torch.nonzero(self.slots < 0).flatten()
        if miss.numel():
            res = insert_keys(storage, self.keys[miss], self.tags[miss],
                              torch.zeros_like(miss), allow_evict=False)
            self.slots[miss] = res.slots
        if bool((self.slots < 0).any()):
            raise SystemExit("the table refused keys: raise --capacity")
        u = self.keys.numel()
        self.hit = torch.ones(u, dtype=torch.bool, device=DEVICE)
        self.placed = torch.zeros(u, dtype=torch.bool, device=DEVICE)
        self.hit_scores = storage.scores[self.slots].clone()
        n = pairs.numel()
        self.offsets = torch.cat([torch.arange(0, n, ARGS.bag_length, device=DEVICE),
                                  torch.tensor([n], device=DEVICE)])


def _finish(storage: TableStorage, s: Step, state: torch.Tensor | None) -> torch.Tensor:
    # CONSTANT 0.0: no key here is placed or missing
    init = finish.init_spec(InitializerArgs(mode="CONSTANT", value=0.0), s.keys, s.tags,
                           ARGS.dim, seed=lambda: 0, generator=None)
    return finish.finish_rows(storage, s.keys, s.tags, s.slots, ARGS.dim, init, new=init,
                             placed=s.placed, hit=s.hit, hit_scores=s.hit_scores, state=state)


def _parse(text: str) -> tuple[int, int]:
    try:
        first, warps = (int(x) for x in text.split("x"))
    except ValueError:
        raise SystemExit(f"config {text!r} is not AxWARPS, e.g. 4096x4") from None
    return first, warps


def main() -> None:
    spec = getattr(optim, OPTIMIZERS[ARGS.optimizer])()
    state_dim = spec.state_dim(ARGS.dim)
    row_dim = ARGS.dim + state_dim
    num_buckets = -(-ARGS.tables * ARGS.capacity // 128)
    storage = TableStorage.empty(num_buckets, 128, row_dim, device=DEVICE)
    storage.values[:, :ARGS.dim].uniform_(-0.05, 0.05)
    steps = [Step(storage, b) for b in _pair_batches()]
    state = torch.zeros(state_dim, dtype=storage.values.dtype, device=DEVICE) \
        if state_dim else None
    rows = [_finish(storage, s, state) for s in steps]
    k, reps = len(steps), max(1, len(steps) - 2)
    unique = sum(s.keys.numel() for s in steps) / k

    def pool(i, **table):
        source = storage.values if table else rows[i]
        return fused_tt.pool_rows(source, steps[i].inverse, steps[i].offsets, None, False,
                                  **table)

    grads = [torch.randn_like(r) * 1e-3 for r in rows]
    out_grad = torch.randn(ARGS.ids // ARGS.tables * ARGS.tables // ARGS.bag_length, ARGS.dim,
                           device=DEVICE) * 1e-3
    positions = torch.arange(out_grad.shape[0], device=DEVICE).repeat_interleave(
        ARGS.bag_length)  # every id's gradient row: its bag's

    def reduce(i, fused, by_order):
        s = steps[i]
        gidx = positions[s.order] if by_order else positions
        common = dict(sorted_rows=s.sorted_rows, sorted_gidx=by_order)
        if fused:
            return fused_tt.reduce_and_apply(out_grad, gidx, s.order, s.row_start, s.slots,
                                             storage.values, spec, None, 1, **common)
        return fused_tt.reduce_rows(out_grad, gidx, s.order, s.row_start, **common)

    kernels = [  # (module, its launch knob, the knob's first field, configs, timed kernels)
        (finish, "FINISH_CONFIG", "elements", ARGS.finish_configs,
         {"finish": lambda i: _finish(storage, steps[i], state)}),
        (fused_tt, "POOL_CONFIG", "rows", ARGS.pool_configs,
         {"pool_rows": pool,
          "pool_table": lambda i: pool(i, slots=steps[i].slots, dim=ARGS.dim)}),
        (sequence_tt, "GATHER_CONFIG", "rows", ARGS.gather_configs,
         {"gather": lambda i: sequence_tt.gather_padded(
             rows[i], steps[i].inverse, steps[i].offsets, ARGS.bag_length)}),
        (optimizer_tt, "APPLY_CONFIG", "rows", ARGS.apply_configs,
         {"apply": lambda i: optimizer_tt.apply_sparse_update(
             storage.values, steps[i].slots, grads[i], spec, None, 1)}),
        (None, None, None, [],
         {f"{what}_{how}": functools.partial(reduce, fused=what == "reduce_apply",
                                             by_order=how == "sorted")
          for what in ("reduce", "reduce_apply") for how in ("by_position", "sorted")}),
    ]
    _write(_sweep(kernels, reps, k), unique, row_dim)


def _sweep(kernels: list[tuple], reps: int, k: int) -> dict[str, dict[str, float]]:
    """Device ms of each timed kernel (by name) under each launch config of its module's
    knob ("default": the knob unset), over ``reps`` calls cycling through ``k`` steps."""
    results = {}
    for module, knob, first, configs, timed in kernels:
        for name in timed:
            results[name] = {}
        for cfg in ["default", *configs]:
            if cfg != "default":
                count, warps = _parse(cfg)
                setattr(module, knob, {first: count, "num_warps": warps})
            try:
                for name, fn in timed.items():
                    results[name][cfg] = time_device_ms(fn, reps,
                                                        setup=lambda i: i % k)["device_ms"]
            finally:
                if knob is not None:
                    setattr(module, knob, None)
    return results


def _write(results: dict, unique: float, row_dim: int) -> None:
    env = environment()
    lines = ["# Row kernels of the embedding layer: launch configurations", "",
             f"Command: `{command_line()}`", "",
             f"Date {env['date']}, GPU {env['gpu']}, torch {env['torch']}, triton "
             f"{env['triton']}. {ARGS.ids} ids a step ({unique:.0f} unique on average), dim "
             f"{ARGS.dim}, rows of {row_dim} columns ({ARGS.optimizer}), bags of "
             f"{ARGS.bag_length}; device ms, median over {max(1, ARGS.steps - 2)} steps.", "",
             "| kernel | config | ms |", "| --- | --- | --- |"]
    for kernel, by_cfg in results.items():
        for cfg, ms in by_cfg.items():
            lines.append(f"| {kernel} | {cfg} | {ms:.4f} |")
    text = "\n".join(lines) + "\n"
    print(text, flush=True)
    if ARGS.out:
        write_results(ARGS.out, {"env": env, "command": command_line(), "args": vars(ARGS),
                                 "unique_ids": unique, "ms": results}, text)


if __name__ == "__main__":
    main()
