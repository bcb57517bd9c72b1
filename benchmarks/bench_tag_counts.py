"""What a fused storage's counts by table cost: the ``add_by_tag`` kernel and the lookup.

A dynamic table that serves several fused tables (``TableOptions.tag_names``) adds, in
every training lookup, its admission rejections and refused inserts to per-tag counts
(``TableReport._count_by_tag``: one ``add_by_tag`` launch, ``ops/tag_counts``). This
times, at each ``--sizes`` entry:

- the kernel alone, on the tags of a lookup's keys as the embedding layer passes them
  (sorted by tag, then key: its deduplication's order) and shuffled (every block then
  holds every tag), with masks flagging the shares of keys the lookups below rejected
  and refused;
- the training lookup of the fused storage (``HashTable.lookup(train=True)`` with
  tags and counts, as ``hashrec.embedding.lookup.lookup_rows`` calls it) with
  ``tag_names`` (counting) against the same storage built without them (the same
  tags passed, nothing counted), captured (the CUDA graph replay a training step
  runs at max_capacity, ``hashrec.table.lookup_graphs``) and eager (graphs off).

The storage is the fused storage of ``--config`` with the most tables (in the taobao
MultiTowerDIN example ``deep``: six admission-enabled tables of dim 16, LFU scores,
admission at 3, Adagrad state), as ``plan_storages`` builds it, its capacities scaled by
the size's factor and started at max_capacity (where a training run's table ends up;
lookups are captured there only). Keys follow a power law (``--alpha``) over
``--universe`` times each table's capacity, the tables weighted by capacity; a lookup
holds exactly the size's unique keys (with their multiplicities as counts), drawn
afresh, sorted by (tag, key). Both tables are filled with each table's hottest keys to
``--fill`` of its capacity and settled by ``--settle`` lookups (again before each mode),
then take the same batches: the timed lookups run in a steady state (each a new batch on
the table the previous ones left), the two tables alternating by round (ABBA), so each
timed call of one has a statistical twin in the other's.

``--smoke`` runs the CUDA path's kernels interpreted on CPU tensors
(``HASHREC_FORCE_TRITON=1``, ``TRITON_INTERPRET=1``) at a tiny size, the captured mode
as its padded form without capture.

Usage::

    python benchmarks/bench_tag_counts.py --out benchmarks/results/tag_counts_gpu
    python benchmarks/bench_tag_counts.py --smoke
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _cli import add_out_and_smoke, parse_with_smoke  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
CONFIG = REPO / "examples" / "multi_tower_din_taobao_dynamicemb.config"


def _size(text: str) -> tuple[int, float]:
    """KEYSxSCALE: unique keys a lookup, and the factor on the storage's capacities."""
    keys, _, scale = text.partition("x")
    try:
        return int(keys), float(scale or 1)
    except ValueError:
        raise SystemExit(f"size {text!r} is not KEYSxSCALE, e.g. 65536x1") from None


def _args() -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--config", default=str(CONFIG), help="pipeline config of the storage")
    p.add_argument("--storage", default=None,
                   help="the fused storage to time (default: the one with most tables)")
    p.add_argument("--sizes", type=_size, nargs="+",
                   default=[_size("65536x1"), _size("98304x1"), _size("1048576x16")],
                   help="KEYSxSCALE: unique keys a lookup, factor on the capacities")
    p.add_argument("--alpha", type=float, default=1.05, help="power law of the keys")
    p.add_argument("--universe", type=float, default=2.0,
                   help="distinct keys a table draws from, over its capacity")
    p.add_argument("--fill", type=float, default=0.9,
                   help="share of each table's capacity filled before the lookups")
    p.add_argument("--settle", type=int, default=10, help="lookups before the timing")
    p.add_argument("--reps", type=int, default=20, help="timed lookups a median")
    p.add_argument("--rounds", type=int, default=4, help="medians of each table (ABBA)")
    p.add_argument("--kernel-reps", type=int, default=100)
    p.add_argument("--modes", nargs="+", default=["captured", "eager"],
                   choices=["captured", "eager"])
    add_out_and_smoke(p)
    args = parse_with_smoke(p)
    if args.smoke:  # the CUDA path's kernels interpreted on CPU tensors, tiny sizes
        os.environ.setdefault("HASHREC_FORCE_TRITON", "1")
        args.sizes, args.settle, args.reps, args.rounds, args.kernel_reps = (
            [(40, 0.0005)], 1, 1, 2, 1)
    return args


ARGS = _args()

import torch  # noqa: E402
from _timing import command_line, environment, time_device_ms, write_results  # noqa: E402

from hashrec.config import load_pipeline_config  # noqa: E402
from hashrec.embedding.plan import StoragePlan, plan_storages  # noqa: E402
from hashrec.features import build_feature_set  # noqa: E402
from hashrec.table import HashTable, TableOptions  # noqa: E402
from hashrec.table import lookup_graphs as lookup_graphs_module  # noqa: E402
from hashrec.table.lookup_graphs import LookupGraphs, graphs_enabled  # noqa: E402
from hashrec.table.ops.tag_counts import add_by_tag, reference  # noqa: E402
from hashrec.train.optimizers import sparse_optimizer_spec  # noqa: E402

DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
SEED = 5
WARMUP = 0 if ARGS.smoke else 2
if ARGS.smoke:  # size classes of a few keys, as the interpreted tests use
    lookup_graphs_module.MIN_STEP = 16


def _plan() -> StoragePlan:
    """The fused dynamic storage of ``--config`` (``--storage``, or the one with most
    tables) as the embedding layer plans it on one rank."""
    config = load_pipeline_config(ARGS.config)
    spec = sparse_optimizer_spec(config.train_config.sparse_optimizer)
    plans = [p for p in plan_storages(build_feature_set(config).embedding_tables(), spec,
                                      DEVICE, 1, note_splits=False)
             if p.is_dynamic and p.fused]
    if ARGS.storage is not None:
        plans = [p for p in plans if p.name == ARGS.storage]
    if not plans:
        raise SystemExit(f"{ARGS.config}: no fused dynamic storage"
                         + (f" named {ARGS.storage!r}" if ARGS.storage else ""))
    return max(plans, key=lambda p: len(p.tables))


def _options(plan: StoragePlan, scale: float) -> tuple[TableOptions, list[int]]:
    """The storage's options with capacities scaled, started at max_capacity, seeded;
    and each table's capacity (by tag)."""
    caps = [max(1, round(t.dynamic.max_capacity * scale)) for t in plan.tables]
    o = plan.options
    admission = o.admission
    bucket = o.bucket_capacity
    if admission is not None:
        counter = max(1, round((admission.counter_capacity or o.max_capacity) * scale))
        admission = dataclasses.replace(admission, counter_capacity=counter)
        if ARGS.smoke:  # buckets of a tiny table
            admission = dataclasses.replace(admission, counter_bucket_capacity=64)
    if ARGS.smoke:
        bucket = 16
    return dataclasses.replace(o, max_capacity=sum(caps), init_capacity=None,
                               admission=admission, bucket_capacity=bucket,
                               seed=SEED), caps


class KeyStream:
    """Batches of unique (tag, key) pairs: a power law over each table's keys, the tables
    weighted by capacity; batch ``i`` is the same for every caller."""

    def __init__(self, caps: list[int]) -> None:
        sizes = [max(2, round(ARGS.universe * c)) for c in caps]
        self.offsets = torch.tensor([0, *sizes], device=DEVICE).cumsum(0)
        weights = []
        for cap, size in zip(caps, sizes):
            p = torch.arange(1, size + 1, device=DEVICE, dtype=torch.float64) ** -ARGS.alpha
            weights.append(p * (cap / p.sum()))
        cdf = torch.cat(weights).cumsum(0)
        self.cdf = cdf / cdf[-1]

    def hottest(self, tag: int, n: int) -> torch.Tensor:
        """The ``n`` most frequent keys of ``tag``."""
        return torch.arange(min(n, int(self.offsets[tag + 1] - self.offsets[tag])),
                            device=DEVICE)

    def batch(self, u: int, i: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Batch ``i``: u unique keys (u,) int64, tags (u,) int32, counts (u,) int64."""
        gen = torch.Generator(device=DEVICE).manual_seed(SEED * 1_000_003 + i)
        draws = 4 * u
        for _ in range(8):
            at = torch.searchsorted(self.cdf, torch.rand(draws, generator=gen,
                                                         dtype=torch.float64, device=DEVICE))
            pairs, counts = torch.unique(at.clamp_(max=self.cdf.numel() - 1),
                                         return_counts=True)
            if pairs.numel() >= u:
                break
            draws *= 2
        else:
            raise SystemExit(f"{u} unique keys not drawn from {self.cdf.numel()} in "
                             f"{draws} draws; raise --universe or lower --alpha")
        keep = torch.rand(pairs.numel(), generator=gen, device=DEVICE).argsort()[:u].sort()[0]
        pairs, counts = pairs[keep], counts[keep]  # sorted by (tag, key)
        tags = torch.searchsorted(self.offsets[1:], pairs, right=True)
        return pairs - self.offsets[tags], tags.to(torch.int32), counts


def _fill(table: HashTable, stream: KeyStream, caps: list[int]) -> None:
    """Each table's hottest keys up to ``--fill`` of its capacity, in chunks."""
    gen = torch.Generator(device=DEVICE).manual_seed(SEED)
    parts = [stream.hottest(tag, int(ARGS.fill * cap)) for tag, cap in enumerate(caps)]
    keys = torch.cat(parts)
    tags = torch.cat([torch.full_like(k, tag, dtype=torch.int32) for tag, k in enumerate(parts)])
    for k, t in zip(keys.split(1 << 20), tags.split(1 << 20)):
        values = 0.05 * torch.randn(k.numel(), table.dim, generator=gen, device=DEVICE)
        table.insert_or_assign(k, values, tags=t)


def _lookup(table: HashTable, batch) -> torch.Tensor:
    """One training step's lookup of the storage, as ``lookup_rows`` makes it."""
    keys, tags, counts = batch
    table.advance_step()
    return table.lookup(keys, tags=tags, train=True, counts=counts).values


def _graphs(table: HashTable, mode: str):
    """What ``table._lookup_graphs`` holds in ``mode``: its captured lookups (CUDA), the
    padded form uncaptured (the same kernels, on the CPU), or False (eager)."""
    if mode == "eager":
        return False
    return LookupGraphs(table, capture=DEVICE.type == "cuda")


def _modes(table: HashTable) -> list[str]:
    """``--modes`` this device and table support."""
    if not table._fixed_path():  # the reference path: no graphs, one form
        return ["eager"]
    captured = graphs_enabled(DEVICE) or DEVICE.type != "cuda"
    return [m for m in ARGS.modes if m != "captured" or captured]


def _tables(options: TableOptions, stream: KeyStream, caps: list[int]) -> dict:
    """The two storages, filled and settled identically: {"tags": ..., "no_tags": ...}."""
    tables = {"tags": HashTable(options),
              "no_tags": HashTable(dataclasses.replace(options, tag_names=()))}
    for table in tables.values():
        _fill(table, stream, caps)
    return tables


def _time_lookups(tables: dict, stream: KeyStream, u: int, mode: str, first: int) -> dict:
    """Median device, call and issue ms of each table's lookups, one median a round,
    the tables alternating ABBA on the same batches; and how many lookups the captured
    graphs served."""
    graphs = {name: _graphs(t, mode) for name, t in tables.items()}
    for name, table in tables.items():
        table._lookup_graphs = graphs[name]
        for i in range(ARGS.settle):
            _lookup(table, stream.batch(u, first + i))
    first += ARGS.settle
    per_call = 2 * (WARMUP + ARGS.reps)  # time_device_ms's calls of setup
    out = {name: {"device_ms": [], "call_ms": [], "issue_ms": [], "spin_short": 0}
           for name in tables}
    replays = {name: g.replays if g else 0 for name, g in graphs.items()}
    for r in range(ARGS.rounds):
        batches = [stream.batch(u, first + i) for i in range(per_call)]
        first += per_call
        order = list(tables) if r % 2 == 0 else list(reversed(tables))
        for name in order:
            t = time_device_ms(lambda b, table=tables[name]: _lookup(table, b), ARGS.reps,
                               WARMUP, setup=lambda i, bs=batches: bs[i])
            for what in ("device_ms", "call_ms", "issue_ms"):
                out[name][what].append(t[what])
            out[name]["spin_short"] += t["spin_short"]
        del batches
    for name, g in graphs.items():
        out[name]["graph_lookups"] = (g.replays - replays[name]) if g else 0
    return out


def _time_kernel(tags: torch.Tensor, shares: tuple[float, float], num_tags: int) -> dict:
    """``add_by_tag`` on ``tags`` with masks flagging ``shares`` of the keys at random:
    device, call and issue us, and whether its sums are the reference's."""
    gen = torch.Generator(device=DEVICE).manual_seed(SEED)
    masks = [torch.rand(tags.numel(), generator=gen, device=DEVICE) < s for s in shares]
    sums = torch.zeros(2, num_tags + 1, dtype=torch.int64, device=DEVICE)
    add_by_tag(sums, tags, masks)
    want = torch.zeros(2, num_tags + 1, dtype=torch.int64)
    reference.add_by_tag(want, tags.cpu(), [m.cpu() for m in masks])
    same = torch.equal(sums.cpu(), want)
    t = time_device_ms(lambda: add_by_tag(sums, tags, masks), ARGS.kernel_reps, WARMUP)
    return {"device_us": 1e3 * t["device_ms"], "call_us": 1e3 * t["call_ms"],
            "issue_us": 1e3 * t["issue_ms"], "same_as_reference": same}


def _counts(table: HashTable) -> dict:
    return {k: v for k, v in table.stats().items()
            if k.split("/")[0] in ("lookups", "hits", "inserts", "evictions", "refused",
                                   "admission_rejected", "size")}


def _adds_up(stats: dict, names: tuple[str, ...]) -> bool:
    """Whether the counts by tag sum to the totals (every key's tag is a table's)."""
    return all(sum(stats[f"{c}/{n}"] for n in names) == stats[c]
               for c in ("admission_rejected", "refused"))


def _size_row(plan: StoragePlan, u: int, scale: float) -> dict:
    """One size's figures: the lookups in each mode (the same two tables, settled again
    for each), then the kernel at the lookups' rejected and refused shares."""
    options, caps = _options(plan, scale)
    stream = KeyStream(caps)
    row = {"keys": u, "scale": scale, "tags": len(caps), "capacity": options.max_capacity,
           "table_capacities": caps, "modes": {}}
    tables = _tables(options, stream, caps)
    first, shares = 0, (0.0, 0.0)
    for mode in _modes(tables["tags"]):
        before = {name: _counts(t) for name, t in tables.items()}
        m = _time_lookups(tables, stream, u, mode, first)
        first += ARGS.settle + ARGS.rounds * 2 * (WARMUP + ARGS.reps)
        after = {name: _counts(t) for name, t in tables.items()}
        looked = after["tags"]["lookups"] - before["tags"]["lookups"]
        shares = tuple((after["tags"][c] - before["tags"][c]) / max(1, looked)
                       for c in ("admission_rejected", "refused"))
        m.update({"rejected_share": shares[0], "refused_share": shares[1],
                  "hit_share": (after["tags"]["hits"] - before["tags"]["hits"]) / max(1, looked),
                  "stats": after, "counts_add_up": _adds_up(after["tags"], options.tag_names)})
        row["modes"][mode] = m
    del tables
    if DEVICE.type == "cuda":
        torch.cuda.empty_cache()
    tags = stream.batch(u, first)[1]
    shuffled = tags[torch.randperm(tags.numel(), device=DEVICE)]
    row["kernel"] = {"sorted": _time_kernel(tags, shares, len(caps)),
                     "shuffled": _time_kernel(shuffled, shares, len(caps))}
    return row


def main() -> None:
    plan = _plan()
    rows = []
    for u, scale in ARGS.sizes:
        row = _size_row(plan, u, scale)
        print({k: v for k, v in row.items() if k != "modes"}, flush=True)
        print(_markdown_rows([row]), flush=True)
        rows.append(row)
    results = {"command": command_line(), **environment(), "config": ARGS.config,
               "storage": plan.name, "tag_names": list(plan.options.tag_names),
               "alpha": ARGS.alpha, "universe": ARGS.universe, "fill": ARGS.fill,
               "settle": ARGS.settle, "reps": ARGS.reps, "rounds": ARGS.rounds,
               "warmup": WARMUP, "kernel_reps": ARGS.kernel_reps, "rows": rows}
    markdown = _markdown(results)
    print(markdown)
    if ARGS.out:
        write_results(ARGS.out, results, markdown)


def _median(values: list[float]) -> float:
    return statistics.median(values)


def _markdown_rows(rows: list[dict]) -> str:
    lines = ["| keys | capacity | kernel us, sorted tags (one call) | shuffled tags | lookup "
             "| with counts us (one call) | without us (one call) | ratio | difference us "
             "| hits, rejected, refused | counts add up |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        k = r["kernel"]
        kernel = (f"{k['sorted']['device_us']:.1f} ({k['sorted']['call_us']:.1f})"
                  f"{'' if k['sorted']['same_as_reference'] else ' NOT AS REFERENCE'}")
        shuffled = (f"{k['shuffled']['device_us']:.1f} ({k['shuffled']['call_us']:.1f})"
                    f"{'' if k['shuffled']['same_as_reference'] else ' NOT AS REFERENCE'}")
        for mode, m in r["modes"].items():
            on, off = (1e3 * _median(m[n]["device_ms"]) for n in ("tags", "no_tags"))
            on_call, off_call = (1e3 * _median(m[n]["call_ms"]) for n in ("tags", "no_tags"))
            lines.append(
                f"| {r['keys']:,} | {r['capacity']:,} | {kernel} | {shuffled} | {mode} "
                f"| {on:.1f} ({on_call:.1f}) | {off:.1f} ({off_call:.1f}) | {on / off:.3f} "
                f"| {on - off:+.1f} | {m['hit_share']:.1%}, {m['rejected_share']:.1%}, "
                f"{m['refused_share']:.2%} "
                f"| {'yes' if m['counts_add_up'] else 'NO'} |")
    return "\n".join(lines)


def _markdown(results: dict) -> str:
    rounds = []
    for r in results["rows"]:
        for mode, m in r["modes"].items():
            per = " / ".join(f"{1e3 * a:.1f}:{1e3 * b:.1f}" for a, b in
                             zip(m["tags"]["device_ms"], m["no_tags"]["device_ms"]))
            rounds.append(f"- {r['keys']:,} keys, {mode}: {per} (graph-served lookups "
                          f"{m['tags']['graph_lookups']} and {m['no_tags']['graph_lookups']}"
                          f", spins outrun {m['tags']['spin_short']} and "
                          f"{m['no_tags']['spin_short']})")
    return "\n".join([
        "# Counts by table of a fused storage: the kernel and the training lookup", "",
        f"Command: `{results['command']}`", "",
        f"Date {results['date']}, GPU {results['gpu']}, torch {results['torch']}, "
        f"triton {results['triton']}. Storage `{results['storage']}` of "
        f"`{os.path.relpath(results['config'], REPO)}` ({len(results['tag_names'])} tables: "
        f"{', '.join(results['tag_names'])}), capacities scaled to the row's, started at "
        f"max_capacity, filled to {results['fill']:.0%} with each table's hottest keys and "
        f"settled by {results['settle']} lookups; keys by a power law (alpha "
        f"{results['alpha']}) over {results['universe']}x each table's capacity, a lookup's "
        "unique keys drawn afresh and sorted by (tag, key).", "",
        "Kernel: `add_by_tag` alone on a lookup's tags (as the layer orders them, and "
        f"shuffled), masks at the lookups' rejected and refused shares; median of "
        f"{results['kernel_reps']} calls. Lookup: `HashTable.lookup(train=True)` of the "
        "storage with `tag_names` (counting) and without (the same tags, no counting), "
        "captured (the CUDA graph a training step replays) and eager; each timed call "
        "starts from the state the previous lookups left (steady state), the two "
        f"tables taking the same batches, alternating ABBA over {results['rounds']} rounds; "
        f"a figure is the median of the rounds' medians of {results['reps']} calls. "
        "us are the device's time with the host's issue hidden (in brackets one call "
        "between syncs, host issue included); ratio: with counts over without; hits, "
        "rejected, refused: shares of the looked-up keys (the table with counts, settling "
        "included); counts add up: its counts by table sum to its totals.", "",
        _markdown_rows(results["rows"]), "",
        "Per round (with:without device us):", "", *rounds, ""])


if __name__ == "__main__":
    main()
