"""Embedding training step in dynamicemb's published setup.

10 tables of dim 128 (fp32), one id per sample per table, ``--ids`` ids per step
drawn from a power law (alpha 1.05), 1,677,721 rows of capacity per table, all
in GPU memory. The 10 dynamic tables share one fused table storage (table index
as the tag). Timed, each the median over steps with distinct id batches:

* forward: dedup of (id, table) pairs, find (+ insert of misses), pooled gather
  straight from table rows (``pool_rows`` with slots);
* backward + SGD / + Adam: per-unique-id gradient reduction fused with the
  optimizer update of embedding and state (``reduce_and_apply``).

``--data-types float16 bfloat16`` also times the layer with its tables stored in half
precision (``TableOptions.dtype``: rows and optimizer state in that type, lookups and
updates computed in float32), against the float32 layer of the same run.

The same steps are also timed through the trainer's layer, ``EmbeddingCollection``
(10 dynamic tables in one fusion group, one sum-pooled feature each): its one-pass
dedup sort, captured training lookups (find, insert, row initialization), pooling
from table rows by slot, and backward (the per-unique-id gradient reduction, then the
sparse optimizer's update of the stored rows), as a training step runs them.

Baseline in the same run: 10 ``torch.nn.EmbeddingBag`` (sum, sparse gradients)
with ``torch.optim.SGD`` / ``torch.optim.SparseAdam``. Each time is also given as
the bandwidth it implies for a minimal byte count, as a fraction of the measured
device copy bandwidth.

    python benchmarks/bench_embedding_layer.py --out benchmarks/results/embedding_layer_gpu
    python benchmarks/bench_embedding_layer.py --smoke
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tables", type=int, default=10)
    p.add_argument("--dim", type=int, default=128)
    p.add_argument("--ids", type=int, default=1_048_570)
    p.add_argument("--capacity", type=int, default=1_677_721)
    p.add_argument("--key-range", type=int, default=1_000_000,
                   help="distinct keys per table the power law draws from")
    p.add_argument("--alpha", type=float, default=1.05)
    p.add_argument("--steps", type=int, default=10)
    p.add_argument("--fresh", type=float, default=0.01,
                   help="share of each step's ids replaced by ids the tables never saw, in an "
                        "extra timing of the layer's SGD forward (0: skip it)")
    p.add_argument("--out", default=None)
    p.add_argument("--smoke", action="store_true")
    p.add_argument("--reduce-configs", nargs="*", default=[],
                   help="extra backward tiles to time: ELEMENTSxWARPS of stage 1 (or rROWSxWARPS: "
                        "ROWS sorted positions a program), optionally xHEADS of stage 2, e.g. "
                        "4096x4, 2048x4x64 or r8x1; the kernels' backward and the layer's SGD "
                        "backward are timed with each")
    p.add_argument("--profile", action="store_true",
                   help="also profile the layer's SGD steps (torch.profiler) and write the "
                        "kernels by device time to OUT_profile.txt")
    p.add_argument("--trace", action="store_true",
                   help="also profile the layer's SGD forward with the next deduplication "
                        "ahead and write every kernel per step, and the device's busy time "
                        "against its span, to OUT_trace.txt (with --fresh, the same for "
                        "batches with new ids to OUT_fresh_trace.txt)")
    p.add_argument("--data-types", nargs="*", default=[], choices=["float16", "bfloat16"],
                   help="also time the layer (forward with the next deduplication ahead, "
                        "backward + SGD, backward + Adam) with its tables' rows and optimizer "
                        "state stored in these types (the float32 layer is the baseline)")
    p.add_argument("--host-profile", action="store_true",
                   help="also profile the host side of the layer's SGD forward (cProfile, "
                        "functions by own and by cumulative time) into OUT_host_profile.txt")
    args = p.parse_args()
    if args.smoke:
        os.environ.setdefault("TRITON_INTERPRET", "1")
        args.tables, args.dim, args.ids, args.capacity, args.key_range, args.steps = (
            2, 8, 60, 512, 100, 1)
    return args


ARGS = _args()
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import torch  # noqa: E402
from _layer_profile import host_profile, profile_steps, trace_calls  # noqa: E402
from _timing import copy_bandwidth, environment, time_device_ms, write_results  # noqa: E402

from hashrec.embedding.ops.fused import dedup  # noqa: E402
from hashrec.embedding.ops.fused import triton as fused_tt  # noqa: E402
from hashrec.embedding.ops.fused.triton import pool_rows, reduce_and_apply  # noqa: E402
from hashrec.table.ops.find.triton import find_slots  # noqa: E402
from hashrec.table.ops.insert.triton import insert_keys  # noqa: E402
from hashrec.table.optim import SparseAdam, SparseSGD  # noqa: E402
from hashrec.table.storage import TableStorage  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
TAG_SHIFT = 40  # keys < 2**40 here, so (tag << 40) | key identifies a (key, table) pair


def _pairs(batch: torch.Tensor) -> torch.Tensor:
    """(tables, ids) keys -> (tables * ids,) int64 (table, key) pairs."""
    tags = torch.arange(ARGS.tables, device=DEVICE)[:, None].expand_as(batch)
    return ((tags << TAG_SHIFT) | batch).flatten()


def _split(unique: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Unique pairs -> (keys, int32 tags)."""
    return unique & ((1 << TAG_SHIFT) - 1), (unique >> TAG_SHIFT).to(torch.int32)


def _power_law_batches(steps: int) -> list[torch.Tensor]:
    """Per step (tables, ids // tables) int64 keys from p(k) ~ (k + 1) ** -alpha."""
    ranks = torch.arange(1, ARGS.key_range + 1, device=DEVICE, dtype=torch.float64)
    probs = (ranks ** -ARGS.alpha).float()
    per_table = ARGS.ids // ARGS.tables
    perm = torch.randperm(ARGS.key_range, device=DEVICE)  # hot keys are not the small ints
    return [perm[torch.multinomial(probs, per_table * ARGS.tables, replacement=True)]
            .view(ARGS.tables, per_table) for _ in range(steps)]


class FusedStep:
    """Forward / backward of the 10 tables over one fused table storage."""

    def __init__(self, spec) -> None:
        self.spec = spec
        row_dim = ARGS.dim + spec.state_dim(ARGS.dim)
        num_buckets = -(-ARGS.tables * ARGS.capacity // 128)
        self.storage = TableStorage.empty(num_buckets, 128, row_dim, device=DEVICE)
        self.storage.values[:, :ARGS.dim].uniform_(-0.05, 0.05)
        self.step = 0

    def forward(self, batch: torch.Tensor):
        d = dedup(_pairs(batch))
        keys, utags = _split(d.unique)
        slots = find_slots(self.storage, keys, utags)
        miss = torch.nonzero(slots < 0).flatten()
        if miss.numel():
            res = insert_keys(self.storage, keys[miss], utags[miss],
                              torch.full_like(miss, self.step), allow_evict=True)
            slots[miss] = res.slots
        offsets = torch.arange(batch.numel() + 1, device=DEVICE)
        pooled = pool_rows(self.storage.values, d.inverse, offsets, None, False, slots=slots,
                           dim=ARGS.dim)
        return pooled, d, slots

    def backward(self, grad: torch.Tensor, d, slots: torch.Tensor) -> None:
        self.step += 1
        positions = torch.arange(grad.shape[0], device=DEVICE)
        reduce_and_apply(grad, positions, d.order, d.row_start, slots, self.storage.values,
                         self.spec, None, self.step)


def _fused(spec, batches, grads) -> dict:
    model = FusedStep(spec)
    for b in batches:  # warm-up: every key of every batch gets inserted
        model.forward(b)
    k = len(batches)
    fwd = time_device_ms(lambda b: model.forward(b), k - 2, setup=lambda i: batches[i % k])
    states = [model.forward(b) for b in batches]
    bwd = time_device_ms(lambda s: model.backward(grads, s[1], s[2]), k - 2,
                         setup=lambda i: states[i % k])
    unique = sum(s[1].unique.numel() for s in states) / len(states)
    sweep = {}
    for cfg in ARGS.reduce_configs:
        _use_reduce_config(cfg)
        t = time_device_ms(lambda s: model.backward(grads, s[1], s[2]), len(batches) - 2,
                           setup=lambda i: states[i % len(states)])
        sweep[cfg] = {"device_ms": t["device_ms"], "call_ms": t["call_ms"]}
    fused_tt.REDUCE_CONFIG = None
    return {"forward_ms": fwd["device_ms"], "backward_ms": bwd["device_ms"],
            "forward_call_ms": fwd["call_ms"], "backward_call_ms": bwd["call_ms"],
            "unique_ids": unique,
            "backward_sweep_ms": sweep,
            "forward_parts_ms": _forward_parts(model, batches)}


def _default_tiles() -> str:
    def text(c: dict) -> str:
        first = f"r{c['rows']}" if c.get("rows") else str(c["elements"])
        return f"{first}x{c['num_warps']}x{c['heads']}"

    return f"{text(fused_tt._reduce_tiles(False))} (fused: {text(fused_tt._reduce_tiles(True))})"


def _use_reduce_config(cfg: str) -> None:
    """Sets ``REDUCE_CONFIG`` from ELEMENTSxWARPS[xHEADS] or rROWSxWARPS[xHEADS]."""
    first, warps, *heads = cfg.split("x")
    rows = int(first[1:]) if first.startswith("r") else 0
    fused_tt.REDUCE_CONFIG = {"elements": 2048 if rows else int(first), "rows": rows,
                              "num_warps": int(warps), "heads": int(heads[0]) if heads else 64}


def _forward_parts(model: FusedStep, batches) -> dict:
    """Times the stages of the forward on their own (dedup, find, pooled gather)."""
    steps = len(batches) - 2
    flat = [_pairs(b) for b in batches]
    dd = [dedup(f) for f in flat]
    keys = [_split(d.unique) for d in dd]
    slots = [find_slots(model.storage, k, t) for k, t in keys]
    offsets = torch.arange(batches[0].numel() + 1, device=DEVICE)
    k = len(batches)
    times = {
        "dedup": time_device_ms(dedup, steps, setup=lambda i: flat[i % k]),
        "find": time_device_ms(lambda kt: find_slots(model.storage, *kt), steps,
                               setup=lambda i: keys[i % k]),
        "pool": time_device_ms(lambda i: pool_rows(model.storage.values, dd[i].inverse,
                                                   offsets, None, False, slots=slots[i],
                                                   dim=ARGS.dim), steps,
                               setup=lambda i: i % k),
    }
    return {name: t["device_ms"] for name, t in times.items()}


def _forwards_ahead(layer, forward, inputs, batches, names, lengths, sgd: bool) -> tuple:
    """The layer's forward with the next dedup ahead, timed: as the trainer runs it, and
    (SGD tables) with the dedup on the step's stream (CUDA), with ``--fresh`` ids new to
    the tables, and traced (``--trace``). (ahead, one stream or None, fresh or None)."""
    k = len(inputs)
    ahead = time_device_ms(lambda i: _forward_prepared(layer, forward, inputs, i), k - 2,
                           setup=lambda i: i)
    one_stream = None
    if DEVICE.type == "cuda" and sgd:
        one_stream = _one_stream(lambda: time_device_ms(
            lambda i: _forward_prepared(layer, forward, inputs, i), k - 2, setup=lambda i: i))
    fresh = None
    if ARGS.fresh and sgd:
        fresh_inputs = _fresh_inputs(batches, 2 * k + 2, names, lengths)
        fresh = time_device_ms(lambda i: _forward_prepared(layer, forward, fresh_inputs, i),
                               k - 2, setup=lambda i: i)
    if ARGS.trace and sgd:
        trace_calls(lambda i: _forward_prepared(layer, forward, inputs, i), k, ARGS.out)
        if fresh is not None:  # batches with ids new again
            traced = _fresh_inputs(batches, k + 2, names, lengths, start=2 * k + 2)
            trace_calls(lambda i: _forward_prepared(layer, forward, traced, i), k, ARGS.out,
                        "fresh", f" ({ARGS.fresh:.0%} of the ids new to the tables)")
    return ahead, one_stream, fresh


def _collection(optimizer, batches, grads, dtype: str = "float32", brief: bool = False) -> dict:
    """Forward and backward ms of the step through ``EmbeddingCollection``, its tables
    stored in ``dtype``. ``brief``: the forward with the next dedup ahead alone, none of
    the extra timings (sweeps, profiles, one stream, fresh ids)."""
    from hashrec.embedding import (
        EmbeddingCollection,
        EmbeddingFeatureSpec,
        EmbeddingTableSpec,
        KeyedJaggedTensor,
    )
    from hashrec.table import InitializerArgs, TableOptions

    options = TableOptions(dim=ARGS.dim, max_capacity=ARGS.capacity,
                           init_capacity=ARGS.capacity, bucket_capacity=128,
                           initializer=InitializerArgs(mode="UNIFORM", lower=-0.05, upper=0.05),
                           dtype=getattr(torch, dtype), device=DEVICE)
    names = [f"f{t}" for t in range(ARGS.tables)]
    layer = EmbeddingCollection(
        [EmbeddingTableSpec(f"t{t}", ARGS.dim, dynamic=options, fusion_group="all")
         for t in range(ARGS.tables)],
        [EmbeddingFeatureSpec(name, f"t{t}") for t, name in enumerate(names)],
        optimizer, device=DEVICE)
    lengths = torch.ones(batches[0].numel(), dtype=torch.int64, device=DEVICE)
    inputs = [KeyedJaggedTensor.from_lengths(names, b.flatten(), lengths) for b in batches]
    grad_chunks = list(grads.view(ARGS.tables, -1, ARGS.dim))

    def forward(kjt):
        pooled = layer(kjt).pooled
        return [pooled[name] for name in names]

    def backward(outs):
        torch.autograd.backward(outs, grad_chunks)

    for _ in range(2):  # every key inserted, every size class captured
        for kjt in inputs:
            backward(forward(kjt))
    k = len(inputs)
    fwd = time_device_ms(forward, k - 2, setup=lambda i: inputs[i % k])
    bwd = time_device_ms(backward, k - 2, setup=lambda i: forward(inputs[i % k]))
    if brief:
        ahead = time_device_ms(lambda i: _forward_prepared(layer, forward, inputs, i), k - 2,
                               setup=lambda i: i)
        return {"forward_ms": fwd["device_ms"], "forward_ahead_ms": ahead["device_ms"],
                "backward_ms": bwd["device_ms"]}
    sweep = {}
    for cfg in ARGS.reduce_configs if isinstance(optimizer, SparseSGD) else []:
        _use_reduce_config(cfg)
        t = time_device_ms(backward, k - 2, setup=lambda i: forward(inputs[i % k]))
        sweep[cfg] = {"device_ms": t["device_ms"], "call_ms": t["call_ms"]}
    fused_tt.REDUCE_CONFIG = None
    if ARGS.profile and isinstance(optimizer, SparseSGD):
        profile_steps(lambda i: backward(forward(inputs[i % k])), k, ARGS.out)
    if ARGS.host_profile and isinstance(optimizer, SparseSGD):
        host_profile(forward, inputs, ARGS.out)
    ahead, one_stream, fresh = _forwards_ahead(layer, forward, inputs, batches, names,
                                               lengths, isinstance(optimizer, SparseSGD))
    timed = (("forward", fwd), ("forward_ahead", ahead), ("backward", bwd),
             ("forward_fresh", fresh), ("forward_ahead_one_stream", one_stream))
    return {**{f"{part}_{what}": t[f"{what}_ms"] if what != "ms" else t["device_ms"]
               for part, t in timed if t is not None for what in ("ms", "call", "issue")},
            "backward_sweep_ms": sweep}


def _fresh_inputs(batches, count: int, names: list[str], lengths: torch.Tensor,
                  start: int = 0) -> list:
    """``count`` batches (the power-law batches in turn) whose first ``--fresh`` share of
    each table's ids are ids no batch held before (past the key range, new every batch;
    ``start``: the batches made before by calls with these arguments, not repeated)."""
    from hashrec.embedding import KeyedJaggedTensor

    per_table = batches[0].shape[1]
    new = max(1, int(ARGS.fresh * per_table))
    out = []
    for j in range(count):
        b = batches[j % len(batches)].clone()
        b[:, :new] = ARGS.key_range + (start + j) * new + torch.arange(new, device=DEVICE)
        kjt = KeyedJaggedTensor.from_lengths(names, b.flatten(), lengths)
        kjt.host_layout()  # known on the host ahead, as the loader's batches carry it
        out.append(kjt)
    return out


def _dedup_counts() -> dict:
    """How the layers' dedup sorts ran on the device: sorts, replays of captures,
    captures, and sorts of a captured size class run uncaptured (every capture's outputs
    held)."""
    from hashrec.embedding import dedup_graphs

    device = torch.device("cuda", torch.cuda.current_device()) if DEVICE.type == "cuda" \
        else DEVICE  # the device of the batches' tensors, which names the sorts
    graphs = dedup_graphs.graphs_for(device)
    return {name: getattr(graphs, name, None)
            for name in ("sorts", "replays", "captures", "uncaptured")}


def _forward_prepared(layer, forward, inputs, i: int):
    """The forward of batch ``i`` as a training step runs it: its deduplication was
    started by the previous call (``prepare``), and this call starts the next batch's
    before its own lookups (on a GPU on the dedup stream, beside them). The device time
    then counts one deduplication and one lookup a step (the current stream waits for
    the dedup stream at the end), and the host reads sizes that are already there."""
    from hashrec.embedding import batching

    k = len(inputs)
    kjt = inputs[i % k]
    if not layer.is_prepared(kjt):
        layer.prepare(kjt)
    layer.prepare(inputs[(i + 1) % k])
    out = forward(kjt)
    if DEVICE.type == "cuda":
        torch.cuda.current_stream().wait_stream(batching.dedup_stream(DEVICE))
    return out


def _one_stream(timing):
    """``timing()`` with the dedup sorts on the current stream (``HASHREC_DEDUP_STREAM=0``),
    the baseline of the dedup stream."""
    from hashrec.embedding import batching

    before = os.environ.get(batching.ASIDE_ENV)
    os.environ[batching.ASIDE_ENV] = "0"
    try:
        return timing()
    finally:
        if before is None:
            del os.environ[batching.ASIDE_ENV]
        else:
            os.environ[batching.ASIDE_ENV] = before


def _baseline(optim: str, batches, grads) -> dict:
    bags = [torch.nn.EmbeddingBag(ARGS.capacity, ARGS.dim, mode="sum", sparse=True,
                                  device=DEVICE) for _ in range(ARGS.tables)]
    params = [p for b in bags for p in b.parameters()]
    opt = (torch.optim.SGD(params, lr=0.01) if optim == "sgd"
           else torch.optim.SparseAdam(params, lr=0.001))
    per_table = ARGS.ids // ARGS.tables
    offsets = torch.arange(per_table, device=DEVICE)
    grad_chunks = grads.view(ARGS.tables, per_table, ARGS.dim)

    def forward(batch):
        return [bag(batch[t], offsets) for t, bag in enumerate(bags)]

    def backward(outs):
        torch.autograd.backward(outs, list(grad_chunks))
        opt.step()
        opt.zero_grad(set_to_none=True)

    k = len(batches)
    fwd = time_device_ms(lambda b: forward(b), k - 2, setup=lambda i: batches[i % k])
    bwd = time_device_ms(backward, k - 2, setup=lambda i: forward(batches[i % k]))
    return {"forward_ms": fwd["device_ms"], "backward_ms": bwd["device_ms"],
            "forward_call_ms": fwd["call_ms"], "backward_call_ms": bwd["call_ms"]}


def _phase_rows(figures: dict, n: int, u: int, bw: float) -> list[dict]:
    """One row a phase: the fused kernels', the layer's and the baseline's ms, and the
    fraction of the copy bandwidth ``bw`` the phase's least bytes (n ids, u unique
    rows) take in that time. ``figures``: phase -> (kernels' results, layer's results,
    "forward" or "backward", baseline's results)."""
    row = 4 * ARGS.dim
    bytes_min = {"forward": n * 8 + u * row + n * row, "backward_sgd": n * row + 2 * u * row,
                 "backward_adam": n * row + 6 * u * row}
    rows = []
    for name, (fused, layer, part, base) in figures.items():
        ms, layer_ms = fused[f"{part}_ms"], layer[f"{part}_ms"]
        rows.append({"phase": name, "hashrec_ms": ms, "layer_ms": layer_ms,
                     "hashrec_call_ms": fused[f"{part}_call_ms"],
                     "layer_call_ms": layer[f"{part}_call"],
                     "layer_issue_ms": layer[f"{part}_issue"],
                     "layer_fraction_of_copy_bw": bytes_min[name] / (layer_ms * 1e-3) / bw,
                     "embedding_bag_ms": base[f"{part}_ms"],
                     "embedding_bag_call_ms": base[f"{part}_call_ms"],
                     "min_bytes": bytes_min[name],
                     "fraction_of_copy_bw": bytes_min[name] / (ms * 1e-3) / bw,
                     "bandwidth_floor_ms": bytes_min[name] / bw * 1e3})
    return rows


def main() -> None:
    batches = _power_law_batches(ARGS.steps + 2)
    n = batches[0].numel()
    grads = torch.randn(n, ARGS.dim, device=DEVICE)
    bw = copy_bandwidth(DEVICE, 2 ** 32 if DEVICE.type == "cuda" else 2 ** 20)
    sgd, adam = _fused(SparseSGD(lr=0.01), batches, grads), _fused(SparseAdam(lr=0.001),
                                                                    batches, grads)
    layer_sgd = _collection(SparseSGD(lr=0.01), batches, grads)
    layer_adam = _collection(SparseAdam(lr=0.001), batches, grads)
    base_sgd, base_adam = _baseline("sgd", batches, grads), _baseline("adam", batches, grads)
    by_type = {"float32": _type_row(layer_sgd, layer_adam)}
    for dtype in ARGS.data_types:
        by_type[dtype] = _type_row(
            _collection(SparseSGD(lr=0.01), batches, grads, dtype, brief=True),
            _collection(SparseAdam(lr=0.001), batches, grads, dtype, brief=True))
    u = sgd["unique_ids"]
    rows = _phase_rows({"forward": (sgd, layer_sgd, "forward", base_sgd),
                        "backward_sgd": (sgd, layer_sgd, "backward", base_sgd),
                        "backward_adam": (adam, layer_adam, "backward", base_adam)}, n, u, bw)
    results = {"env": environment(), "args": {k: v for k, v in vars(ARGS).items() if k != "out"},
               "ids_per_step": n, "mean_unique_ids": u,
               "forward_parts_ms": sgd["forward_parts_ms"],
               "layer_forward_ahead": {what: layer_sgd[f"forward_ahead_{what}"]
                                       for what in ("ms", "call", "issue")},
               "layer_forward_ahead_one_stream": {
                   what: layer_sgd[f"forward_ahead_one_stream_{what}"]
                   for what in ("ms", "call", "issue")} if DEVICE.type == "cuda" else None,
               "layer_forward_fresh": {what: layer_sgd[f"forward_fresh_{what}"]
                                       for what in ("ms", "call", "issue")}
               if ARGS.fresh else None,
               "layer_forward_adam": {what: layer_adam[f"forward_{what}"]
                                      for what in ("ms", "call", "issue")},
               "layer_forward_ahead_adam": {what: layer_adam[f"forward_ahead_{what}"]
                                            for what in ("ms", "call", "issue")},
               "backward_sweep_ms": {"sgd": sgd["backward_sweep_ms"],
                                     "adam": adam["backward_sweep_ms"],
                                     "layer_sgd": layer_sgd["backward_sweep_ms"]},
               "layer_by_data_type": by_type,
               "copy_bandwidth_Bps": bw, "rows": rows, "dedup_sorts": _dedup_counts(),
               "notes": "HashRec kernels: hashrec.embedding.ops.fused kernels over one "
                        f"fused TableStorage ({ARGS.tables} tables as tags), driven "
                        "directly. HashRec layer: the same steps through "
                        "EmbeddingCollection, as the trainer "
                        "runs them; its host issue time is the host clock from the call to "
                        "its return. Each ms is the device's time with the host's issue "
                        "hidden behind a spin queued ahead (a step that reads the device on "
                        "the host, such as a deduplication's size, waits for it, so its "
                        "host time after that read still counts); in brackets, one call "
                        "between device syncs, host issue included."}
    _write(results)


def _sweep_lines(results: dict) -> list[str]:
    """The backward's device ms at each ``--reduce-configs`` tile, the default first."""
    sweep = results["backward_sweep_ms"]
    base = {r["phase"]: r for r in results["rows"]}
    lines = ["", "Backward at other stage-1 tiles (device ms; the default in the first row):",
             "", "| tiles | kernels, SGD | kernels, Adam | layer, SGD |",
             "| --- | --- | --- | --- |",
             f"| default {_default_tiles()} | {base['backward_sgd']['hashrec_ms']:.3f} | "
             f"{base['backward_adam']['hashrec_ms']:.3f} | "
             f"{base['backward_sgd']['layer_ms']:.3f} |"]
    for cfg in ARGS.reduce_configs:
        lines.append(f"| {cfg} | " + " | ".join(
            f"{sweep[k][cfg]['device_ms']:.3f}" for k in ("sgd", "adam", "layer_sgd")) + " |")
    return lines


def _type_row(sgd: dict, adam: dict) -> dict:
    """One table type's row of ``layer_by_data_type`` from its SGD and Adam layers' times."""
    return {"forward_ms": sgd["forward_ms"], "forward_ahead_ms": sgd["forward_ahead_ms"],
            "backward_sgd_ms": sgd["backward_ms"], "backward_adam_ms": adam["backward_ms"]}


def _data_type_lines(by_type: dict) -> list[str]:
    """The layer's device ms by the tables' storage type, each with its speed-up over
    float32 in this run."""
    parts = (("forward_ms", "forward"), ("forward_ahead_ms", "forward, next dedup ahead"),
             ("backward_sgd_ms", "backward + SGD"), ("backward_adam_ms", "backward + Adam"))
    base = by_type["float32"]
    lines = ["", "The layer with its tables stored in each type (device ms; in brackets the "
             "float32 layer's time over this one's):", "",
             "| tables | " + " | ".join(name for _, name in parts) + " |",
             "| --- |" + " --- |" * len(parts)]
    for dtype, t in by_type.items():
        lines.append(f"| {dtype} | " + " | ".join(
            f"{t[k]:.3f} ({base[k] / t[k]:.2f}x)" for k, _ in parts) + " |")
    return lines


def _write(results: dict) -> None:
    lines = ["| phase | HashRec kernels ms (one call) | HashRec layer ms (one call) | "
             "layer host issue ms | nn.EmbeddingBag ms (one call) | floor ms (min bytes / "
             "copy bw) | fraction of copy bw (kernels / layer) |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for r in results["rows"]:
        lines.append(f"| {r['phase']} | {r['hashrec_ms']:.3f} ({r['hashrec_call_ms']:.3f}) | "
                     f"{r['layer_ms']:.3f} ({r['layer_call_ms']:.3f}) | "
                     f"{r['layer_issue_ms']:.3f} | {r['embedding_bag_ms']:.3f} "
                     f"({r['embedding_bag_call_ms']:.3f}) | {r['bandwidth_floor_ms']:.3f} | "
                     f"{r['fraction_of_copy_bw']:.2f} / "
                     f"{r['layer_fraction_of_copy_bw']:.2f} |")
    ahead = results["layer_forward_ahead"]
    forward = next(r for r in results["rows"] if r["phase"] == "forward")
    share = forward["min_bytes"] / (ahead["ms"] * 1e-3) / results["copy_bandwidth_Bps"]
    lines += ["", "Layer forward with the next batch's deduplication started ahead, as a "
              "training step runs it (`prepare`; its time counts one deduplication and one "
              f"lookup): {ahead['ms']:.3f} ms ({ahead['call']:.3f} one call, host issue "
              f"{ahead['issue']:.3f} ms); {share:.2f} of the copy bandwidth for the "
              "forward's minimal bytes."]
    one = results["layer_forward_ahead_one_stream"]
    if one:
        lines += ["", "The same with the deduplication on the step's own stream "
                  f"(`HASHREC_DEDUP_STREAM=0`), in the same run: {one['ms']:.3f} ms "
                  f"({one['call']:.3f} one call, host issue {one['issue']:.3f} ms); ratio "
                  f"{one['ms'] / ahead['ms']:.2f}x."]
    fresh = results["layer_forward_fresh"]
    if fresh:
        lines += ["", f"The same with {ARGS.fresh:.0%} of each step's ids new to the tables "
                  f"(inserted by the lookup): {fresh['ms']:.3f} ms ({fresh['call']:.3f} one "
                  f"call, host issue {fresh['issue']:.3f} ms)."]
    adam, adam_ahead = results["layer_forward_adam"], results["layer_forward_ahead_adam"]
    lines += ["", "Layer forward of tables with Adam rows (the embedding, then its two state "
              f"vectors): {adam['ms']:.3f} ms ({adam['call']:.3f} one call); with the "
              f"next deduplication ahead {adam_ahead['ms']:.3f} ms ({adam_ahead['call']:.3f} "
              "one call)."]
    if ARGS.reduce_configs:
        lines += _sweep_lines(results)
    if ARGS.data_types:
        lines += _data_type_lines(results["layer_by_data_type"])
    table = "\n".join(lines)
    print(json.dumps(results), flush=True)
    print(table)
    if ARGS.out:
        env = results["env"]
        write_results(ARGS.out, results,
                      f"# Embedding layer step on GPU\n\nCommand: `python "
                      f"benchmarks/bench_embedding_layer.py {' '.join(sys.argv[1:])}`\n\n"
                      f"Date {env['date']}, GPU {env['gpu']}, torch "
                      f"{env['torch']}, triton {env['triton']}. {results['ids_per_step']} ids "
                      f"per step ({results['mean_unique_ids']:.0f} unique on average), copy "
                      f"bandwidth {results['copy_bandwidth_Bps'] / 1e12:.2f} TB/s.\n\n"
                      f"{table}\n\n{results['notes']}\n")


if __name__ == "__main__":
    main()
